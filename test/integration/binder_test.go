package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	k8smetrics "k8s.io/component-base/metrics"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

const (
	rwo = corev1.ReadWriteOnce
	rox = corev1.ReadOnlyMany
	rwx = corev1.ReadWriteMany
)

// checkBound checks the four writes of a binding as upstream makes them:
// the volume's claimRef (kind, version, namespace, name, UID), both phases
// Bound, bind-completed on the claim, bound-by-controller on each side
// exactly when wanted, and the claim's status access modes and capacity
// taken from the volume.
func checkBound(t *testing.T, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, pvcByController, pvByController bool) {
	t.Helper()
	if pvc.Spec.VolumeName != pv.Name {
		t.Errorf("claim %s: volumeName = %q, want %s", pvc.Name, pvc.Spec.VolumeName, pv.Name)
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Kind != "PersistentVolumeClaim" || ref.APIVersion != "v1" || ref.Namespace != pvc.Namespace || ref.Name != pvc.Name || ref.UID != pvc.UID {
		t.Errorf("PV %s: claimRef = %+v, want claim %s/%s with UID %s", pv.Name, ref, pvc.Namespace, pvc.Name, pvc.UID)
	}
	if pv.Status.Phase != corev1.VolumeBound || pvc.Status.Phase != corev1.ClaimBound {
		t.Errorf("phases: PV %s %s, claim %s %s; want Bound, Bound", pv.Name, pv.Status.Phase, pvc.Name, pvc.Status.Phase)
	}
	if pvc.Annotations[annBindCompleted] != "yes" {
		t.Errorf("claim %s: %s = %q, want yes", pvc.Name, annBindCompleted, pvc.Annotations[annBindCompleted])
	}
	if got := metav1.HasAnnotation(pvc.ObjectMeta, annBoundByController); got != pvcByController {
		t.Errorf("claim %s: has %s = %v, want %v (annotations %v)", pvc.Name, annBoundByController, got, pvcByController, pvc.Annotations)
	} else if got && pvc.Annotations[annBoundByController] != "yes" {
		t.Errorf("claim %s: %s = %q, want yes", pvc.Name, annBoundByController, pvc.Annotations[annBoundByController])
	}
	if got := metav1.HasAnnotation(pv.ObjectMeta, annBoundByController); got != pvByController {
		t.Errorf("PV %s: has %s = %v, want %v (annotations %v)", pv.Name, annBoundByController, got, pvByController, pv.Annotations)
	} else if got && pv.Annotations[annBoundByController] != "yes" {
		t.Errorf("PV %s: %s = %q, want yes", pv.Name, annBoundByController, pv.Annotations[annBoundByController])
	}
	if !slices.Equal(pvc.Status.AccessModes, pv.Spec.AccessModes) {
		t.Errorf("claim %s: status access modes %v, want the PV's %v", pvc.Name, pvc.Status.AccessModes, pv.Spec.AccessModes)
	}
	got, want := pvc.Status.Capacity[corev1.ResourceStorage], pv.Spec.Capacity[corev1.ResourceStorage]
	if got.Cmp(want) != 0 {
		t.Errorf("claim %s: status capacity %s, want the PV's %s", pvc.Name, got.String(), want.String())
	}
	if inflight.Has(pvc) {
		t.Errorf("claim %s: bound with the in-flight finalizer: %v", pvc.Name, pvc.Finalizers)
	}
}

func isBound(pvc *corev1.PersistentVolumeClaim) bool { return pvc.Status.Phase == corev1.ClaimBound }

// TestBinderStaticBinding: a claim with a selector binds to the smallest
// Available static volume of its class that has its access modes (fewest
// extra modes first), volume mode and labels, with upstream's four writes.
// Smaller, unlabeled, wrong-mode, wrong-access-mode and larger volumes stay
// Available, and a volume of another driver is never written.
func TestBinderStaticBinding(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	rb := e.startBinder(binderConfig{})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))

	pv := func(suffix, size string) *testutil.PVBuilder {
		return testutil.NewPV(e.name(suffix), e.driver).Class(sc.Name).Size(size).Label("tier", "db")
	}
	fit := e.createPV(pv("fit", "5Gi"))
	others := []*corev1.PersistentVolume{
		e.createPV(pv("bigger", "10Gi")),
		e.createPV(pv("small", "1Gi")),                                                     // too small
		e.createPV(pv("rox", "3Gi").AccessModes(rox)),                                      // wrong access mode
		e.createPV(pv("multi", "3Gi").AccessModes(rwo, rwx)),                               // fits, but with an extra access mode
		e.createPV(pv("block", "3Gi").Block()),                                             // wrong volume mode
		e.createPV(testutil.NewPV(e.name("nolabel"), e.driver).Class(sc.Name).Size("3Gi")), // not selected
	}
	foreign := e.createPV(testutil.NewPV(e.name("foreign"), "other."+e.driver).Class(sc.Name).Size("3Gi").Label("tier", "db"))
	for _, v := range append([]*corev1.PersistentVolume{fit}, others...) {
		e.waitPVPhase(v.Name, corev1.VolumeAvailable)
	}

	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name).Size("2Gi").Selector(map[string]string{"tier": "db"}))
	pvc := e.waitClaim(claim.Name, "Bound", isBound)
	checkBound(t, pvc, e.getPV(fit.Name), true, true)
	for _, k := range []string{annStorageProv, annBetaStorageProv} {
		if v, ok := pvc.Annotations[k]; ok {
			t.Errorf("claim bound to a static volume was handed to a provisioner: %s=%s", k, v)
		}
	}

	// Everything else stays as it was, also over later resyncs.
	rb.waitResyncs(t, 2)
	for _, v := range others {
		got := e.getPV(v.Name)
		if got.Spec.ClaimRef != nil || got.Status.Phase != corev1.VolumeAvailable {
			t.Errorf("PV %s: claimRef %+v phase %s, want none, Available", v.Name, got.Spec.ClaimRef, got.Status.Phase)
		}
	}
	if got := e.getPV(foreign.Name); got.ResourceVersion != foreign.ResourceVersion {
		t.Errorf("PV %s of another driver was written: resourceVersion %s -> %s (phase %s, claimRef %+v)",
			foreign.Name, foreign.ResourceVersion, got.ResourceVersion, got.Status.Phase, got.Spec.ClaimRef)
	}
}

// TestBinderDeletingClaim: a claim being deleted, held by the in-flight
// finalizer as during a long CreateVolume, does not take an unbound static
// volume that appears meanwhile: the volume is left for a live claim
// instead of being bound, then Released and reclaimed when the claim goes.
func TestBinderDeletingClaim(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	rb := e.startBinder(binderConfig{})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	held := e.createClaim(testutil.NewPVC(e.ns, "held").Class(sc.Name).Size("1Gi"))
	e.waitClaim(held.Name, "handed over with the in-flight finalizer", func(c *corev1.PersistentVolumeClaim) bool {
		return inflight.Has(c)
	})
	e.deleteClaim(held.Name)
	e.waitClaim(held.Name, "being deleted", func(c *corev1.PersistentVolumeClaim) bool { return c.DeletionTimestamp != nil })

	pv := e.createPV(testutil.NewPV(e.name("static"), e.driver).Class(sc.Name).Size("1Gi"))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	rb.waitResyncs(t, 2)
	if got := e.getPV(pv.Name); got.Spec.ClaimRef != nil || got.Status.Phase != corev1.VolumeAvailable {
		t.Errorf("static volume with only a claim being deleted: claimRef %+v, phase %s; want none, Available", got.Spec.ClaimRef, got.Status.Phase)
	}
	if got := e.getClaim(held.Name); got.Spec.VolumeName != "" {
		t.Errorf("claim being deleted took volume %s", got.Spec.VolumeName)
	}

	// The provisioner would release the finalizer; the volume then goes to
	// the next claim.
	if _, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Patch(t.Context(), held.Name, types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	live := e.createClaim(testutil.NewPVC(e.ns, "live").Class(sc.Name).Size("1Gi"))
	if got := e.waitClaim(live.Name, "Bound", isBound); got.Spec.VolumeName != pv.Name {
		t.Errorf("live claim bound to %q, want the static volume %s", got.Spec.VolumeName, pv.Name)
	}
}

// TestBinderPreBound: volumes and claims that users pre-bound bind to each
// other; bound-by-controller is written only on the side the binder chose
// (upstream GetBindVolumeToClaim and bindClaimToVolume).
func TestBinderPreBound(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	e.startBinder(binderConfig{})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	newPV := func(suffix string) *testutil.PVBuilder {
		return testutil.NewPV(e.name(suffix), e.driver).Class(sc.Name).Size("5Gi")
	}
	// Pre-bound by the volume's claimRef (name only); a smaller Available
	// volume would otherwise be the better match.
	byPV := e.createPV(newPV("by-pv").ClaimRef(e.ns, "by-pv", ""))
	decoy := e.createPV(testutil.NewPV(e.name("decoy"), e.driver).Class(sc.Name).Size("1Gi"))
	// Pre-bound by the claim's spec.volumeName.
	requested := e.createPV(newPV("requested"))
	// Pre-bound on both sides.
	mutual := e.createPV(newPV("mutual").ClaimRef(e.ns, "mutual", ""))
	for _, v := range []*corev1.PersistentVolume{byPV, decoy, requested, mutual} {
		e.waitPVPhase(v.Name, corev1.VolumeAvailable)
	}

	e.createClaim(testutil.NewPVC(e.ns, "by-pv").Class(sc.Name))
	e.createClaim(testutil.NewPVC(e.ns, "by-claim").Class(sc.Name).VolumeName(requested.Name))
	e.createClaim(testutil.NewPVC(e.ns, "mutual").Class(sc.Name).VolumeName(mutual.Name))

	for _, tc := range []struct {
		claim, pv                         string
		claimByController, pvByController bool
	}{
		{"by-pv", byPV.Name, true, false},
		{"by-claim", requested.Name, false, true},
		{"mutual", mutual.Name, false, false},
	} {
		pvc := e.waitClaim(tc.claim, "Bound", isBound)
		checkBound(t, pvc, e.getPV(tc.pv), tc.claimByController, tc.pvByController)
	}
	if got := e.getPV(decoy.Name); got.Spec.ClaimRef != nil || got.Status.Phase != corev1.VolumeAvailable {
		t.Errorf("decoy PV: claimRef %+v phase %s, want none, Available", got.Spec.ClaimRef, got.Status.Phase)
	}
}

// TestBinderReclaimPolicies: when its claim is deleted, a volume becomes
// Released; the binder alone never deletes anything (Delete and Retain stay
// Released), Recycle (not supported for CSI) and an unknown policy become
// Failed with a Warning event.
func TestBinderReclaimPolicies(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	rb := e.startBinder(binderConfig{})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	hist := recordHistory(t, e.c, e.ns)

	for _, tc := range []struct {
		name      string
		policy    corev1.PersistentVolumeReclaimPolicy
		wantPhase corev1.PersistentVolumePhase
		reason    string // Warning event on the PV
		message   string // fragment of the event and of status.message
	}{
		{name: "delete", policy: corev1.PersistentVolumeReclaimDelete, wantPhase: corev1.VolumeReleased},
		{name: "retain", policy: corev1.PersistentVolumeReclaimRetain, wantPhase: corev1.VolumeReleased},
		{name: "recycle", policy: corev1.PersistentVolumeReclaimRecycle, wantPhase: corev1.VolumeFailed, reason: "VolumeFailedRecycle", message: "Recycle failed"},
		{name: "unknown", policy: "Shred", wantPhase: corev1.VolumeFailed, reason: "VolumeUnknownReclaimPolicy", message: "unrecognized PersistentVolumeReclaimPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := *e
			e.t = t
			b := testutil.NewPV(e.name(tc.name), e.driver).Class(sc.Name).ReclaimPolicy(tc.policy).Label("row", tc.name)
			if err := e.policySettable(b.Obj()); err != nil {
				t.Skipf("the API server refuses reclaim policy %q on create and on update, so no volume can have it: %v", tc.policy, err)
			}
			pv := e.createPV(b)
			e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
			claim := e.createClaim(testutil.NewPVC(e.ns, tc.name).Class(sc.Name).Selector(map[string]string{"row": tc.name}))
			e.waitClaim(claim.Name, "Bound", isBound)
			e.deleteClaim(claim.Name)

			got := e.waitPVPhase(pv.Name, tc.wantPhase)
			if tc.reason != "" {
				e.waitEvent(pv.UID, corev1.EventTypeWarning, tc.reason, tc.message)
				if !strings.Contains(got.Status.Message, tc.message) {
					t.Errorf("status.message = %q, want it to contain %q", got.Status.Message, tc.message)
				}
			}
			// It stays so: nothing deletes or rebinds it.
			rb.waitResyncs(t, 2)
			got = e.getPV(pv.Name)
			if got.Status.Phase != tc.wantPhase || got.DeletionTimestamp != nil || got.Spec.ClaimRef == nil || got.Spec.ClaimRef.UID != claim.UID {
				t.Errorf("after resyncs: phase %s, deletionTimestamp %v, claimRef %+v; want %s, nil, the deleted claim",
					got.Status.Phase, got.DeletionTimestamp, got.Spec.ClaimRef, tc.wantPhase)
			}
			var phases []corev1.PersistentVolumePhase
			for _, s := range hist.volumes(func(s pvState) bool { return s.name == pv.Name }) {
				if len(phases) == 0 || phases[len(phases)-1] != s.phase {
					phases = append(phases, s.phase)
				}
			}
			if i := slices.Index(phases, corev1.VolumeReleased); i < 0 || !slices.Contains(phases[:i], corev1.VolumeBound) {
				t.Errorf("phases of the PV: %v, want Bound, then Released", phases)
			}
		})
	}
}

// policySettable returns nil if pv could be created. If validation refuses
// it, it checks (dry run) that an existing volume cannot be updated to pv's
// reclaim policy either and returns both validation errors.
func (e *env) policySettable(pv *corev1.PersistentVolume) error {
	e.t.Helper()
	ctx, pvs := e.t.Context(), e.c.CoreV1().PersistentVolumes()
	dryRun := []string{metav1.DryRunAll}
	probe := pv.DeepCopy()
	probe.ResourceVersion, probe.Status = "", corev1.PersistentVolumeStatus{}
	_, createErr := pvs.Create(ctx, probe, metav1.CreateOptions{DryRun: dryRun})
	switch {
	case createErr == nil:
		return nil
	case !apierrors.IsInvalid(createErr):
		e.t.Fatal(createErr)
	}
	existing := e.createPV(testutil.NewPV(pv.Name+"-probe", e.driver).ReclaimPolicy(corev1.PersistentVolumeReclaimRetain))
	existing.Spec.PersistentVolumeReclaimPolicy = pv.Spec.PersistentVolumeReclaimPolicy
	_, updateErr := pvs.Update(ctx, existing, metav1.UpdateOptions{DryRun: dryRun})
	if updateErr == nil {
		e.t.Fatalf("the API server refuses reclaim policy %q on create (%v) but accepts it on update: extend this test to set it by update",
			pv.Spec.PersistentVolumeReclaimPolicy, createErr)
	}
	return errors.Join(createErr, updateErr)
}

// TestBinderClaimNotInCache (seed bug 2): a volume pre-bound with the UID of
// a claim that exists but that the binder's informer does not show is never
// Released, however many resyncs pass: the binder reads the claim from the
// API server. A volume whose claim really does not exist is Released.
func TestBinderClaimNotInCache(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	hidden := "/api/v1/namespaces/" + e.ns + "/persistentvolumeclaims/hidden"
	var gets atomic.Int64
	hist := recordHistory(t, e.c, e.ns)
	rb := e.startBinder(binderConfig{
		// Applies to every informer of the factory: no other object of the
		// test is named "hidden".
		factoryOpts: []informers.SharedInformerOption{informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "metadata.name!=hidden"
		})},
		wrap: func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodGet && r.URL.Path == hidden {
					gets.Add(1)
				}
				return rt.RoundTrip(r)
			})
		},
	})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))

	claim := e.createClaim(testutil.NewPVC(e.ns, "hidden").Class(sc.Name))
	// As the provisioner writes it for the claim.
	pv := e.createPV(testutil.NewPV(e.name("provisioned"), e.driver).Class(sc.Name).BoundTo(claim).Annotation(annProvisionedBy, e.driver))
	// Control: the same binder releases a volume whose claim does not exist.
	orphan := e.createPV(testutil.NewPV(e.name("orphan"), e.driver).Class(sc.Name).
		ClaimRef(e.ns, "gone", "6d3c3f9e-0000-4000-8000-000000000000").Annotation(annProvisionedBy, e.driver))
	e.waitPVPhase(orphan.Name, corev1.VolumeReleased)

	rb.waitResyncs(t, 3)
	states := hist.volumes(func(s pvState) bool { return s.name == pv.Name })
	for _, s := range states {
		if s.phase == corev1.VolumeReleased || s.phase == corev1.VolumeFailed || s.event == watch.Deleted {
			t.Fatalf("the PV of a claim missing from the binder's cache was released: %v", states)
		}
	}
	got := e.getPV(pv.Name)
	if got.Spec.ClaimRef == nil || got.Spec.ClaimRef.UID != claim.UID {
		t.Errorf("PV claimRef = %+v, want the claim with UID %s", got.Spec.ClaimRef, claim.UID)
	}
	testutil.Eventually(t, 0, "the binder did not read the hidden claim from the API server on its syncs", func(context.Context) (bool, error) {
		return gets.Load() >= 3, nil
	})
	t.Logf("GETs of the hidden claim: %d; states of its PV: %v", gets.Load(), states)
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestBinderClaimLost: a bound claim whose volume is deleted becomes Lost
// with a Warning ClaimLost; a claim that says it is bound to a volume bound
// to another claim becomes Lost with a Warning ClaimMisbound, and the
// rightful binding is left alone.
func TestBinderClaimLost(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	e.startBinder(binderConfig{})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	pv := e.createPV(testutil.NewPV(e.name("pv"), e.driver).Class(sc.Name).Size("3Gi"))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	e.waitClaim(claim.Name, "Bound", isBound)

	intruder := e.createClaim(testutil.NewPVC(e.ns, "intruder").Class(sc.Name).VolumeName(pv.Name).Annotation(annBindCompleted, "yes"))
	e.waitClaimPhase(intruder.Name, corev1.ClaimLost)
	e.waitEvent(intruder.UID, corev1.EventTypeWarning, "ClaimMisbound", "Two claims are bound to the same volume, this one is bound incorrectly")
	checkBound(t, e.getClaim(claim.Name), e.getPV(pv.Name), true, true)

	// The PV protection finalizer keeps a Bound volume; remove it anyway.
	e.removePV(t.Context(), pv.Name)
	e.waitPVGone(pv.Name)
	lost := e.waitClaimPhase(claim.Name, corev1.ClaimLost)
	e.waitEvent(claim.UID, corev1.EventTypeWarning, "ClaimLost", "Bound claim has lost its PersistentVolume. Data on the volume is lost!")
	if lost.Spec.VolumeName != pv.Name || lost.Status.AccessModes != nil || lost.Status.Capacity != nil {
		t.Errorf("lost claim: volumeName %q, status access modes %v, capacity %v; want %s and both cleared (upstream updateClaimStatus with no volume)",
			lost.Spec.VolumeName, lost.Status.AccessModes, lost.Status.Capacity, pv.Name)
	}
}

// TestBinderClaimLostWithoutClass: a claim of class "" that the binder
// bound to a static volume of the driver is in scope only through that
// volume; when the volume is deleted, the claim is still marked Lost.
func TestBinderClaimLostWithoutClass(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	e.startBinder(binderConfig{})
	pv := e.createPV(testutil.NewPV(e.name("pv"), e.driver).Class("").Size("3Gi"))
	e.waitPVPhase(pv.Name, corev1.VolumeAvailable)
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class("").VolumeName(pv.Name))
	e.waitClaim(claim.Name, "Bound", isBound)

	// The PV protection finalizer keeps a Bound volume; remove it anyway.
	e.removePV(t.Context(), pv.Name)
	e.waitPVGone(pv.Name)
	e.waitClaimPhase(claim.Name, corev1.ClaimLost)
	e.waitEvent(claim.UID, corev1.EventTypeWarning, "ClaimLost", "Bound claim has lost its PersistentVolume. Data on the volume is lost!")
}

// refuseProvision is a binder.ProvisionChecker that never lets the binder
// add the in-flight finalizer (no provisioner runs in these tests).
type refuseProvision struct{}

func (refuseProvision) CheckProvision(context.Context, *corev1.PersistentVolumeClaim, *storagev1.StorageClass) error {
	return errors.New("no provisioner in this test")
}

func (refuseProvision) VolumeName(claim *corev1.PersistentVolumeClaim) string {
	return "pvc-" + string(claim.UID)
}

var _ binder.ProvisionChecker = refuseProvision{}

// TestBinderMetrics: the binder's metrics, registered in a registry of the
// caller, count the bound and unbound volumes and claims of its driver (not
// those of another driver), observe one binding duration per binding and
// count its successful writes, with no failed ones.
func TestBinderMetrics(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	reg := k8smetrics.NewKubeRegistry()
	e.startBinder(binderConfig{opts: []binder.Option{binder.WithMetricsRegistry(reg), binder.WithProvisionCheck(refuseProvision{})}})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	for _, v := range []*corev1.PersistentVolume{
		e.createPV(testutil.NewPV(e.name("a"), e.driver).Class(sc.Name).Size("2Gi")),
		e.createPV(testutil.NewPV(e.name("b"), e.driver).Class(sc.Name).Size("2Gi")),
		e.createPV(testutil.NewPV(e.name("spare"), e.driver).Class(sc.Name).Size("100Mi")),
	} {
		e.waitPVPhase(v.Name, corev1.VolumeAvailable)
	}
	e.createPV(testutil.NewPV(e.name("foreign"), "other."+e.driver).Class(sc.Name).Size("2Gi"))
	for _, name := range []string{"c1", "c2"} {
		e.createClaim(testutil.NewPVC(e.ns, name).Class(sc.Name))
		e.waitClaim(name, "Bound", isBound)
	}
	waiting := e.createClaim(testutil.NewPVC(e.ns, "waiting").Class(sc.Name).Size("50Gi"))
	e.waitClaim(waiting.Name, "handed to the provisioner", func(pvc *corev1.PersistentVolumeClaim) bool {
		return pvc.Annotations[annStorageProv] == e.driver
	})

	class := `{storage_class="` + sc.Name + `"}`
	want := map[string]float64{
		"csi_provisioner_binder_bound_pv_count" + class:                 2,
		"csi_provisioner_binder_unbound_pv_count" + class:               1,
		"csi_provisioner_binder_bound_pvc_count" + class:                2,
		"csi_provisioner_binder_unbound_pvc_count" + class:              1,
		"csi_provisioner_binder_binding_duration_seconds_count" + class: 2,
	}
	// At least: two reservations, Available for three volumes and Bound for
	// two, two claim binds and one hand-over, two claim statuses.
	atLeast := map[string]float64{
		`csi_provisioner_binder_writes_total{resource="persistentvolumes",result="success",verb="update"}`:             2,
		`csi_provisioner_binder_writes_total{resource="persistentvolumes",result="success",verb="update_status"}`:      5,
		`csi_provisioner_binder_writes_total{resource="persistentvolumeclaims",result="success",verb="update"}`:        3,
		`csi_provisioner_binder_writes_total{resource="persistentvolumeclaims",result="success",verb="update_status"}`: 2,
	}
	var (
		got      map[string]float64
		lastMiss string
	)
	testutil.Eventually(t, 0, "binder metrics do not show the bindings", func(context.Context) (bool, error) {
		var err error
		if got, err = gatherBinderMetrics(reg); err != nil {
			return false, err
		}
		var miss []string
		for k, v := range want {
			if got[k] != v {
				miss = append(miss, fmt.Sprintf("%s = %g, want %g", k, got[k], v))
			}
		}
		for k, v := range atLeast {
			if got[k] < v {
				miss = append(miss, fmt.Sprintf("%s = %g, want at least %g", k, got[k], v))
			}
		}
		slices.Sort(miss)
		if m := strings.Join(miss, "; "); m != lastMiss {
			lastMiss = m
			t.Logf("metrics not there yet: %s", m)
		}
		return len(miss) == 0, nil
	})
	for k, v := range got {
		if strings.Contains(k, `result="error"`) {
			t.Errorf("%s = %g, want no failed writes", k, v)
		}
		if strings.Contains(k, "other.") {
			t.Errorf("metric about another driver's objects: %s = %g", k, v)
		}
	}
	keys := slices.Sorted(maps.Keys(got))
	for _, k := range keys {
		t.Logf("%s %g", k, got[k])
	}
}

// gatherBinderMetrics returns the binder's metrics in reg as
// "name{label="value",...}" -> value; a histogram gives name_count and
// name_sum.
func gatherBinderMetrics(reg k8smetrics.KubeRegistry) (map[string]float64, error) {
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range families {
		if !strings.HasPrefix(mf.GetName(), "csi_provisioner_binder_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			suffix := "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetGauge() != nil:
				out[mf.GetName()+suffix] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[mf.GetName()+suffix] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[mf.GetName()+"_count"+suffix] = float64(m.GetHistogram().GetSampleCount())
				out[mf.GetName()+"_sum"+suffix] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out, nil
}
