package csiclient

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
)

// TestRedactingSink: everything logged through the logger of a call's
// context is redacted, whatever the logging call: Info and Error messages,
// the error, and key/value pairs given to the call or to WithValues.
func TestRedactingSink(t *testing.T) {
	const secret = "s3cr3t-value"
	var out strings.Builder
	logger := funcr.New(func(prefix, args string) { out.WriteString(prefix + " " + args + "\n") }, funcr.Options{Verbosity: 5})
	r := newRedactor(map[string]string{"password": secret})
	logger = klog.FromContext(r.context(klog.NewContext(t.Context(), logger)))

	logger.Info("info "+secret, "value", secret)
	logger.Error(errors.New("driver said "+secret), "error "+secret, "value", secret)
	logger.WithValues("with", secret).Info("with values")
	logger.WithName("named").V(5).Info("verbose", "err", errors.New("driver said "+secret))

	if got := out.String(); strings.Contains(got, secret) || strings.Count(got, stripped) < 7 {
		t.Errorf("want every secret value replaced by %s:\n%s", stripped, got)
	}
}
