package csiclient

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzRedact strips two secret values from a driver's error message.
// Invariants: the code is kept; no non-empty secret appears whole in the
// message (markers aside); a message without a secret comes back as the
// very same error.
func FuzzRedact(f *testing.F) {
	f.Add("password", "pass", "create failed: secrets map[password:password user:pass]")
	f.Add("abc", "bcd", "abcd")
	f.Add("", "x", "no secret here")
	f.Add("*", "s", stripped)
	f.Fuzz(func(t *testing.T, s1, s2, msg string) {
		r := newRedactor(map[string]string{"a": s1, "b": s2})
		in := status.Error(codes.InvalidArgument, msg)
		out := r.error(in)
		st, ok := status.FromError(out)
		if !ok || st.Code() != codes.InvalidArgument {
			t.Fatalf("redacted error %v lost its code", out)
		}
		if r == nil {
			if !errors.Is(out, in) {
				t.Fatal("no secrets: the error must be returned as it is")
			}
			return
		}
		// Markers may spell a secret together with their neighbours; hide
		// them behind a byte no secret holds.
		sep := "\x00"
		if strings.Contains(s1+s2, sep) {
			return
		}
		plain := strings.ReplaceAll(st.Message(), stripped, sep)
		for _, s := range []string{s1, s2} {
			if s != "" && strings.Contains(plain, s) {
				t.Errorf("secret %q left in %q", s, st.Message())
			}
		}
		if (s1 == "" || !strings.Contains(msg, s1)) && (s2 == "" || !strings.Contains(msg, s2)) && !errors.Is(out, in) {
			t.Errorf("message without secrets changed: %q", st.Message())
		}
	})
}
