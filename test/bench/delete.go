package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// deletions follows the benchmark's PVs on a watch while they are deleted:
// which are left, and when each one went.
type deletions struct {
	n       int
	mu      sync.Mutex
	left    map[string]int // PV name → claim index
	deleted []time.Time    // claim i's Delete call returned
	gone    []time.Time    // claim i's PV disappeared
	changed chan struct{}  // a PV went; capacity 1
}

func newDeletions(n int) *deletions {
	return &deletions{n: n, left: map[string]int{}, deleted: make([]time.Time, n), gone: make([]time.Time, n), changed: make(chan struct{}, 1)}
}

// claimIndex is i for a PV bound to bench/claim-<i>, else -1.
func (d *deletions) claimIndex(pv *corev1.PersistentVolume) int {
	ref := pv.Spec.ClaimRef
	if pv.Spec.StorageClassName != benchClass || ref == nil || ref.Namespace != benchNS {
		return -1
	}
	i, err := strconv.Atoi(strings.TrimPrefix(ref.Name, "claim-"))
	if err != nil || i < 0 || i >= d.n {
		return -1
	}
	return i
}

func (d *deletions) add(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return
	}
	if i := d.claimIndex(pv); i >= 0 {
		d.mu.Lock()
		d.left[pv.Name] = i
		d.mu.Unlock()
	}
}

func (d *deletions) remove(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return
	}
	now := time.Now()
	d.mu.Lock()
	if i, ok := d.left[pv.Name]; ok {
		delete(d.left, pv.Name)
		d.gone[i] = now
	}
	d.mu.Unlock()
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

func (d *deletions) remaining() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.left)
}

// latencies are, sorted, the seconds from each claim's Delete call to its
// PV's disappearance, for the PVs that were there when deletion began.
func (d *deletions) latencies() []float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var lat []float64
	for i := range d.n {
		if !d.gone[i].IsZero() && !d.deleted[i].IsZero() {
			lat = append(lat, d.gone[i].Sub(d.deleted[i]).Seconds())
		}
	}
	sort.Float64s(lat)
	return lat
}

// keepDeletionFields is the PV informer's transform: the wait needs a PV's
// name, class and claim reference only, and at 50,000 PVs the whole objects
// would cost the benchmark process hundreds of megabytes.
func keepDeletionFields(obj any) (any, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return obj, nil
	}
	small := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv.Name, ResourceVersion: pv.ResourceVersion}}
	small.Spec.StorageClassName = pv.Spec.StorageClassName
	if ref := pv.Spec.ClaimRef; ref != nil {
		small.Spec.ClaimRef = &corev1.ObjectReference{Namespace: ref.Namespace, Name: ref.Name}
	}
	return small, nil
}

// deleteAll deletes every claim and waits until every PV of the benchmark's
// class is gone, seen on a watch (no repeated full lists to load the API
// server it measures), then until the driver has no volume left. The
// provisioner deletes a volume before its PV, so a volume still there once
// its PV is gone has leaked: that is an error after a grace of 30 s.
func (b *bench) deleteAll(ctx context.Context, res *result) error {
	n := b.o.N
	d := newDeletions(n)
	factory := informers.NewSharedInformerFactoryWithOptions(b.c, 0, informers.WithTransform(keepDeletionFields))
	inf := factory.Core().V1().PersistentVolumes().Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    d.add,
		UpdateFunc: func(_, o any) { d.add(o) },
		DeleteFunc: d.remove,
	})
	if err != nil {
		return err
	}
	ictx, stop := context.WithCancel(ctx)
	defer stop()
	factory.Start(ictx.Done())
	// The handler's HasSynced, not the informer's: the count of PVs left
	// must include every PV of the initial list.
	if !cache.WaitForCacheSync(ictx.Done(), reg.HasSynced) {
		return fmt.Errorf("PV informer did not sync: %w", ctx.Err())
	}
	logf("deleting %d claims (%d PVs)", n, d.remaining())
	start := time.Now()
	err = b.parallel(ctx, n, func(ctx context.Context, i int) error {
		err := b.c.CoreV1().PersistentVolumeClaims(benchNS).Delete(ctx, fmt.Sprintf("claim-%06d", i), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		t := time.Now()
		d.mu.Lock()
		d.deleted[i] = t
		d.mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, b.o.Timeout)
	defer cancel()
	progress := time.NewTicker(5 * time.Second)
	defer progress.Stop()
	for left := d.remaining(); left > 0; left = d.remaining() {
		select {
		case <-d.changed:
		case <-progress.C:
			logf("%d PVs left after %.1fs", left, time.Since(start).Seconds())
		case <-wctx.Done():
			return fmt.Errorf("deletion did not finish, %d PVs left: %w", left, wctx.Err())
		}
	}
	pvsGone := time.Since(start)
	var vols int
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		v, err := b.driver.ListVolumes(ctx)
		vols = len(v)
		return vols == 0, err
	})
	if err != nil {
		return fmt.Errorf("every PV is gone but the driver still has %d volumes: %w", vols, err)
	}
	elapsed := time.Since(start)
	lat := d.latencies()
	res.Delete = phase{Seconds: elapsed.Seconds(), VolumesPerSecond: float64(n) / elapsed.Seconds()}
	if len(lat) > 0 {
		res.Delete.P50, res.Delete.P95, res.Delete.P99, res.Delete.Max = pct(lat, 0.50), pct(lat, 0.95), pct(lat, 0.99), lat[len(lat)-1]
	}
	logf("every PV gone after %.2fs, every driver volume after %.2fs", pvsGone.Seconds(), elapsed.Seconds())
	return nil
}
