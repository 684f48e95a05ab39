package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// lockedBuffer is a bytes.Buffer that a logger writes from one goroutine
// while the test reads it from another.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestOwnEventsLogged: the events of the sidecar's own recorders (the
// binder's and the provisioner's; the provisioning library logs its own)
// are in the log, naming the object: a Warning at the default verbosity,
// as it is the only account of a claim Pending for a cause only the
// sidecar reports (a missing StorageClass), a Normal one from -v=2. They
// were logged at no verbosity at all.
func TestOwnEventsLogged(t *testing.T) {
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "uid-1"}}
	for _, tc := range []struct {
		verbosity  int
		wantNormal bool
	}{{0, false}, {2, true}} {
		t.Run(strings.Repeat("v", tc.verbosity+1), func(t *testing.T) {
			out := &lockedBuffer{}
			logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(out), textlogger.Verbosity(tc.verbosity)))
			ctx := klog.NewContext(context.WithoutCancel(t.Context()), logger)
			api := fake.NewClientset()
			w := events.NewWriter(api.CoreV1().Events(""), events.WriterOptions{DrainTimeout: time.Minute})
			wctx, stopWriter := context.WithCancel(ctx)
			writerDone := make(chan struct{})
			go func() { defer close(writerDone); w.Run(wctx) }()
			b := newBroadcaster(ctx, newEventSplitClient(fake.NewClientset(), api, w))
			recorder := newRecorder(b, "csi-provisioner-binder", &unwrittenEvents{})
			recorder.Event(claim, corev1.EventTypeNormal, "WaitForFirstConsumer", "waiting for first consumer to be created before binding")
			recorder.Event(claim, corev1.EventTypeWarning, "ProvisioningFailed", `storageclass.storage.k8s.io "gone" not found`)
			testutil.Eventually(t, 10*time.Second, "the Warning event is not logged", func(context.Context) (bool, error) {
				return strings.Contains(out.String(), `reason="ProvisioningFailed"`), nil
			})
			b.Shutdown()
			stopWriter()
			<-writerDone

			log := out.String()
			var warning string
			for line := range strings.SplitSeq(log, "\n") {
				if strings.Contains(line, `reason="ProvisioningFailed"`) {
					warning = line
				}
			}
			for _, want := range []string{`"Event occurred"`, `object="ns/data"`, `kind="PersistentVolumeClaim"`, `type="Warning"`, `message="storageclass.storage.k8s.io \"gone\" not found"`} {
				if !strings.Contains(warning, want) {
					t.Errorf("the Warning's log line %q lacks %s", warning, want)
				}
			}
			if got := strings.Contains(log, `reason="WaitForFirstConsumer"`); got != tc.wantNormal {
				t.Errorf("Normal event logged at -v=%d: %v, want %v; log:\n%s", tc.verbosity, got, tc.wantNormal, log)
			}
		})
	}
}
