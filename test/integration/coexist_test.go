package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// TestCoexistenceWithControllerManagerBinder: the sidecar's binder and
// kube-controller-manager's persistentvolume-binder both run. 30 claims to
// provision and 10 claims for 10 static volumes all end Bound, each exactly
// once: over the whole watch history no claim's volumeName changes once
// set, no volume's claimRef UID changes once set, no volume is named by two
// claims. The driver's volumes are then exactly the PVs' handles. Deleting
// every claim deletes every PV of the driver and every driver volume.
func TestCoexistenceWithControllerManagerBinder(t *testing.T) {
	const dynamic, static = 30, 10
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	e := newEnv(t, cp)
	s := e.startStack()
	dynClass := e.createClass(testutil.NewSC(e.name("dyn"), e.driver))
	// Static volumes and their claims have a class of their own, and each
	// static claim selects its volume by label: the provisioner refuses
	// claims with a selector, so a static claim can only end on its volume.
	staticClass := e.createClass(testutil.NewSC(e.name("static"), e.driver))
	hist := recordHistory(t, e.c, e.ns)

	staticPVs := make([]string, static)
	for i := range static {
		name := e.name(fmt.Sprintf("static-%d", i))
		id := s.createVolume(name)
		staticPVs[i] = e.createPV(s.staticPV(name, id).Class(staticClass.Name).Label("pair", fmt.Sprint(i))).Name
	}
	for _, name := range staticPVs {
		e.waitPVPhase(name, corev1.VolumeAvailable)
	}
	for i := range dynamic {
		e.createClaim(testutil.NewPVC(e.ns, fmt.Sprintf("dyn-%d", i)).Class(dynClass.Name))
	}
	for i := range static {
		e.createClaim(testutil.NewPVC(e.ns, fmt.Sprintf("static-%d", i)).Class(staticClass.Name).Selector(map[string]string{"pair": fmt.Sprint(i)}))
	}

	claims := e.waitAllBound(dynamic + static)
	for i := range claims {
		c := &claims[i]
		var n int
		if _, err := fmt.Sscanf(c.Name, "static-%d", &n); err == nil && c.Spec.VolumeName != staticPVs[n] {
			t.Errorf("claim %s bound to %s, want its static volume %s", c.Name, c.Spec.VolumeName, staticPVs[n])
		}
	}

	// Settled: exactly one PV per claim, pointing back to it, and the
	// driver's volumes are the PVs' handles (a volume provisioned twice
	// would have to be deleted again).
	// The in-flight finalizer comes off every claim, whichever binder bound
	// it.
	testutil.Eventually(t, 0, "PVs, driver volumes and claim finalizers did not settle", func(ctx context.Context) (bool, error) {
		handles, bad, err := e.driverPVs(ctx)
		if err != nil || len(bad) > 0 || len(handles) != dynamic+static {
			return false, err
		}
		if ids, err := s.volumeIDs(ctx); err != nil || !slices.Equal(ids, handles) {
			return false, err
		}
		list, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims = list.Items
		return !slices.ContainsFunc(claims, func(c corev1.PersistentVolumeClaim) bool { return inflight.Has(&c) }), nil
	})
	for i := range claims {
		pv := e.getPV(claims[i].Spec.VolumeName)
		if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != claims[i].UID || pv.Status.Phase != corev1.VolumeBound {
			t.Errorf("PV %s of claim %s: claimRef %+v phase %s", pv.Name, claims[i].Name, ref, pv.Status.Phase)
		}
	}
	for _, v := range hist.checkBindings(e.driver) {
		t.Errorf("binding history: %s", v)
	}
	managers := map[string]int{}
	for i := range claims {
		for _, m := range claims[i].ManagedFields {
			managers[m.Manager+"/"+m.Subresource]++
		}
	}
	t.Logf("field managers of the claims: %v", managers)
	if managers["kube-controller-manager/"]+managers["kube-controller-manager/status"] == 0 {
		t.Errorf("kube-controller-manager never wrote a claim: the two binders did not coexist")
	}

	for i := range claims {
		e.deleteClaim(claims[i].Name)
	}
	testutil.Eventually(t, 0, "PVs of the driver remain after their claims were deleted", func(ctx context.Context) (bool, error) {
		handles, bad, err := e.driverPVs(ctx)
		return len(handles)+len(bad) == 0, err
	})
	s.waitVolumeIDs()
	for _, v := range hist.checkBindings(e.driver) {
		t.Errorf("binding history after deletion: %s", v)
	}
	if errs := hist.watchErrors(); len(errs) > 0 {
		t.Errorf("watch errors (the history may have gaps): %v", errs)
	}
	t.Logf("history: %d PV states, %d claim states", len(hist.volumes(func(s pvState) bool { return s.driver == e.driver })), len(hist.claimStates()))
}

// driverPVs returns the sorted volume handles of the PVs of the test's
// driver that are bound to a claim and Bound, and the names of the others.
func (e *env) driverPVs(ctx context.Context) (handles, others []string, err error) {
	list, err := e.c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	for _, pv := range list.Items {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != e.driver {
			continue
		}
		if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.UID != "" && pv.Status.Phase == corev1.VolumeBound {
			handles = append(handles, pv.Spec.CSI.VolumeHandle)
		} else {
			others = append(others, pv.Name)
		}
	}
	slices.Sort(handles)
	return handles, others, nil
}
