package integration

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	"github.com/kube-storage/csi-provisioner/internal/cachetrim"
	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// Annotations the tests read, spelled out as upstream does.
const (
	annBindCompleted     = "pv.kubernetes.io/bind-completed"
	annBoundByController = "pv.kubernetes.io/bound-by-controller"
	annProvisionedBy     = "pv.kubernetes.io/provisioned-by"
	annStorageProv       = "volume.kubernetes.io/storage-provisioner"
	annBetaStorageProv   = "volume.beta.kubernetes.io/storage-provisioner"
	annSelectedNode      = "volume.kubernetes.io/selected-node"
)

// env is what one test works with: the control plane, a namespace and a CSI
// driver name of its own, and names for cluster-scoped objects that no other
// test uses.
type env struct {
	t      *testing.T
	cp     *controlplane.ControlPlane
	c      kubernetes.Interface
	ns     string
	driver string
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// newEnv creates the test's namespace on cp and picks its driver name.
func newEnv(t *testing.T, cp *controlplane.ControlPlane) *env {
	t.Helper()
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(strings.TrimPrefix(t.Name(), "Test")), "-"), "-")
	if len(base) > 30 {
		base = strings.Trim(base[:30], "-")
	}
	e := &env{t: t, cp: cp, c: cp.Client(), ns: newNamespace(t, cp)}
	e.driver = base + "." + e.ns + ".csi.example"
	return e
}

// name returns a cluster-wide unique name for one of the test's objects.
func (e *env) name(suffix string) string { return e.ns + "-" + suffix }

// createClass creates the class built by b (its name and provisioner as
// given) and deletes it when the test ends.
func (e *env) createClass(b *testutil.SCBuilder) *storagev1.StorageClass {
	e.t.Helper()
	return testutil.CreateClass(e.t, e.c, b.Obj())
}

// createPV creates the volume built by b and removes it, finalizers and
// all, when the test ends.
func (e *env) createPV(b *testutil.PVBuilder) *corev1.PersistentVolume {
	e.t.Helper()
	pv := b.Obj()
	pv.ResourceVersion, pv.UID, pv.Status = "", "", corev1.PersistentVolumeStatus{}
	created, err := e.c.CoreV1().PersistentVolumes().Create(e.t.Context(), pv, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { e.removePV(context.Background(), created.Name) })
	return created
}

// removePV deletes a volume and strips its finalizers, so that it is gone
// whatever state it was in.
func (e *env) removePV(ctx context.Context, name string) {
	e.t.Helper()
	pvs := e.c.CoreV1().PersistentVolumes()
	if err := pvs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Errorf("delete PV %s: %v", name, err)
		return
	}
	_, err := pvs.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Errorf("remove finalizers of PV %s: %v", name, err)
	}
}

// createClaim creates the claim built by b in the test's namespace.
func (e *env) createClaim(b *testutil.PVCBuilder) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc := b.RV("").Obj()
	pvc.Namespace, pvc.UID, pvc.Status = e.ns, "", corev1.PersistentVolumeClaimStatus{}
	created, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Create(e.t.Context(), pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return created
}

func (e *env) deleteClaim(name string) {
	e.t.Helper()
	if err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Delete(e.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) getPV(name string) *corev1.PersistentVolume {
	e.t.Helper()
	pv, err := e.c.CoreV1().PersistentVolumes().Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pv
}

func (e *env) getClaim(name string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	pvc, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pvc
}

// waitClaim waits until the claim satisfies cond and returns it. On timeout
// the message names the claim's last state.
func (e *env) waitClaim(name, what string, cond func(*corev1.PersistentVolumeClaim) bool) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	var got *corev1.PersistentVolumeClaim
	testutil.Eventually(e.t, 0, "claim "+name+" not "+what, func(ctx context.Context) (bool, error) {
		pvc, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got = pvc; cond(pvc) {
			return true, nil
		}
		return false, nil
	})
	return got
}

// waitPV waits until the volume satisfies cond and returns it.
func (e *env) waitPV(name, what string, cond func(*corev1.PersistentVolume) bool) *corev1.PersistentVolume {
	e.t.Helper()
	var got *corev1.PersistentVolume
	testutil.Eventually(e.t, 0, "PV "+name+" not "+what, func(ctx context.Context) (bool, error) {
		pv, err := e.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got = pv; cond(pv) {
			return true, nil
		}
		return false, nil
	})
	return got
}

func (e *env) waitPVPhase(name string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	e.t.Helper()
	return e.waitPV(name, string(phase), func(pv *corev1.PersistentVolume) bool { return pv.Status.Phase == phase })
}

func (e *env) waitClaimPhase(name string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	return e.waitClaim(name, string(phase), func(pvc *corev1.PersistentVolumeClaim) bool { return pvc.Status.Phase == phase })
}

// waitPVGone waits until the volume no longer exists.
func (e *env) waitPVGone(name string) {
	e.t.Helper()
	testutil.Eventually(e.t, 0, "PV "+name+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := e.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// events returns the events about the object with uid, as
// "Type Reason: message" (cluster-scoped objects' events are in "default").
func (e *env) events(ctx context.Context, uid types.UID) ([]string, error) {
	list, err := e.c.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(uid)})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list.Items))
	for _, ev := range list.Items {
		out = append(out, fmt.Sprintf("%s %s: %s", ev.Type, ev.Reason, ev.Message))
	}
	return out, nil
}

// waitEvent waits for an event of eventType and reason about the object with
// uid whose message contains fragment.
func (e *env) waitEvent(uid types.UID, eventType, reason, fragment string) {
	e.t.Helper()
	var last []string
	testutil.Eventually(e.t, 0, fmt.Sprintf("no %s %s event containing %q", eventType, reason, fragment), func(ctx context.Context) (bool, error) {
		evs, err := e.events(ctx, uid)
		if err != nil {
			return false, err
		}
		last = evs
		for _, ev := range evs {
			if strings.HasPrefix(ev, eventType+" "+reason+":") && strings.Contains(ev, fragment) {
				return true, nil
			}
		}
		return false, nil
	})
	e.t.Logf("events of %s: %q", uid, last)
}

// binderConfig configures [env.startBinder].
type binderConfig struct {
	// opts are added after the defaults (1s resync, 2 workers).
	opts []binder.Option
	// factoryOpts configure the informer factory (e.g. a tweak that hides
	// objects from the binder).
	factoryOpts []informers.SharedInformerOption
	// wrap, if set, wraps the binder's HTTP transport (to observe its
	// requests).
	wrap func(http.RoundTripper) http.RoundTripper
}

// runningBinder is a binder started by [env.startBinder].
type runningBinder struct {
	*binder.Binder
	clock *resyncClock
}

// waitResyncs waits until the binder has started n more periodic resyncs
// than when it was called, so that everything queued by the first of them
// has been given a chance to run.
func (r *runningBinder) waitResyncs(t *testing.T, n int64) {
	t.Helper()
	want := r.clock.ticks.Load() + n
	testutil.Eventually(t, 0, fmt.Sprintf("binder did not resync %d times", n), func(context.Context) (bool, error) {
		return r.clock.ticks.Load() >= want, nil
	})
}

// resyncClock is the real clock, except that it counts the ticks delivered
// by tickers of the resync period: the binder's resync loop is the only
// ticker of that period (the work queues' heartbeat tickers run every 10s).
type resyncClock struct {
	clock.RealClock
	period time.Duration
	ticks  atomic.Int64
}

var _ clock.WithTicker = (*resyncClock)(nil)

func (c *resyncClock) NewTicker(d time.Duration) clock.Ticker {
	inner := c.RealClock.NewTicker(d)
	if d != c.period {
		return inner
	}
	ct := &countingTicker{inner: inner, ch: make(chan time.Time), stop: make(chan struct{})}
	go func() {
		for {
			select {
			case now := <-inner.C():
				select {
				case ct.ch <- now:
					c.ticks.Add(1)
				case <-ct.stop:
					return
				}
			case <-ct.stop:
				return
			}
		}
	}()
	return ct
}

// countingTicker forwards a real ticker's ticks through its own channel.
type countingTicker struct {
	inner clock.Ticker
	ch    chan time.Time
	stop  chan struct{}
	once  sync.Once
}

func (t *countingTicker) C() <-chan time.Time { return t.ch }

func (t *countingTicker) Stop() {
	t.once.Do(func() {
		t.inner.Stop()
		close(t.stop)
	})
}

// startBinder runs a binder for the test's driver in this process, on its
// own client and informer factory, with a 1s resync and 2 workers per queue,
// until the test ends. It returns once the binder's caches are synced.
func (e *env) startBinder(cfg binderConfig) *runningBinder {
	e.t.Helper()
	restCfg := rest.CopyConfig(e.cp.AdminConfig())
	restCfg.QPS, restCfg.Burst = 200, 400
	if cfg.wrap != nil {
		restCfg.Wrap(cfg.wrap)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		e.t.Fatal(err)
	}
	// The sidecar's transform, so that the binder is tested on the shared,
	// trimmed objects it sees in production.
	factoryOpts := append([]informers.SharedInformerOption{informers.WithTransform(cachetrim.New().Transform)}, cfg.factoryOpts...)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, factoryOpts...)
	clk := &resyncClock{period: time.Second}
	opts := append([]binder.Option{binder.WithResyncPeriod(clk.period), binder.WithWorkers(2), binder.WithClock(clk)}, cfg.opts...)
	b, err := binder.New(client, e.driver, factory, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	logger := ktesting.NewLogger(e.t, ktesting.NewConfig(ktesting.Verbosity(4)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("binder Run: %v", err)
		}
		factory.Shutdown()
	})
	testutil.Eventually(e.t, 0, "binder caches not synced", func(context.Context) (bool, error) {
		return b.HasSynced(), nil
	})
	return &runningBinder{Binder: b, clock: clk}
}
