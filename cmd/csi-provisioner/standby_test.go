package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestReportStandby: a replica that does not lead names the Lease's holder
// at level 0, once per holder (the repeat interval is long here), says why
// it cannot read the Lease, and stops once it leads.
func TestReportStandby(t *testing.T) {
	const ns, name = "kube-system", "driver"
	holder := func(h string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &h}}
	}
	client := fake.NewClientset(holder("stale-holder"))
	// The fake's reactor chain may not change while reportStandby reads
	// through it (a data race): the Forbidden answer is switched on here.
	var forbidden atomic.Bool
	client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !forbidden.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, name, nil)
	})
	var out syncBuffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&out)))
	ctx := klog.NewContext(t.Context(), logger)
	leading := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		reportStandby(ctx, client.CoordinationV1().Leases(ns), ns, name, leading, time.Millisecond, time.Millisecond, time.Hour)
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", out.String())
		}
	})
	waitLog := func(want string) {
		t.Helper()
		testutil.Eventually(t, 0, "no log line with "+want, func(context.Context) (bool, error) {
			return strings.Contains(out.String(), want), nil
		})
	}
	waitLog(`"Not leading: another process holds the leader election Lease; this replica provisions nothing until it holds it" lease="kube-system/driver" holder="stale-holder"`)
	if _, err := client.CoordinationV1().Leases(ns).Update(t.Context(), holder("new-holder"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLog(`holder="new-holder"`)
	if n := strings.Count(out.String(), `holder="stale-holder"`); n != 1 {
		t.Errorf("the first holder was named %d times within the repeat interval, want 1", n)
	}
	forbidden.Store(true)
	waitLog(`"Not leading: cannot read the leader election Lease; this replica provisions nothing until it holds it" err="leases.coordination.k8s.io \"driver\" is forbidden`)
	close(leading)
	select {
	case <-done:
	case <-time.After(testutil.DefaultTimeout):
		t.Fatal("reportStandby did not return once leading")
	}
}

// TestLeaseName: the Lease is named as upstream's (csi-lib-utils'
// sanitized driver name).
func TestLeaseName(t *testing.T) {
	for driver, want := range map[string]string{
		"hostpath.csi.k8s.io": "hostpath-csi-k8s-io",
		"ebs.csi.aws.com":     "ebs-csi-aws-com",
		"vendor/driver_x.":    "vendor-driver-x-X",
		"Driver-1":            "Driver-1",
	} {
		if got := leaseName(driver); got != want {
			t.Errorf("leaseName(%q) = %q, want %q", driver, got, want)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
