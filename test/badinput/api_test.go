package badinput

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/test/chaos"
)

// apiRow is one bad input through the API server and its expected outcome.
type apiRow struct {
	name string
	// class modifies the row's StorageClass (nil: a plain Immediate class).
	class func(*storagev1.StorageClass)
	// claim modifies the row's claim (1Gi, ReadWriteOnce, the row's class).
	claim func(*testutil.PVCBuilder)
	// createErr: the API server refuses the claim with an error containing
	// every fragment.
	createErr []string
	// want is the event on the claim, which then stays Pending.
	want event
	// custom replaces the claim flow; it gets the row's class name.
	custom func(t *testing.T, s *stack, class string)
	// newVolumes is how many driver volumes the row leaves behind; no
	// volume that existed before may be deleted.
	newVolumes int
}

func secretParams(name, namespace string) map[string]string {
	return map[string]string{
		"csi.storage.k8s.io/provisioner-secret-name":      name,
		"csi.storage.k8s.io/provisioner-secret-namespace": namespace,
	}
}

func apiRows() []apiRow {
	warning := func(fragments ...string) event {
		return event{corev1.EventTypeWarning, "ProvisioningFailed", fragments}
	}
	return []apiRow{
		{
			name: "unknown-reserved-parameter",
			class: func(sc *storagev1.StorageClass) {
				sc.Parameters = map[string]string{"csi.storage.k8s.io/no-such-key": "x"}
			},
			want: warning(`unknown parameter key "csi.storage.k8s.io/no-such-key"`),
		},
		{
			name: "fstype-twice",
			class: func(sc *storagev1.StorageClass) {
				sc.Parameters = map[string]string{"fstype": "ext4", "csi.storage.k8s.io/fstype": "xfs"}
			},
			want: warning(`both "fstype" and "csi.storage.k8s.io/fstype"`),
		},
		{
			name:  "secret-template-unknown-token",
			class: func(sc *storagev1.StorageClass) { sc.Parameters = secretParams("${pvc.unknown}", "${pvc.namespace}") },
			want:  warning("${pvc.unknown}"),
		},
		{
			name:  "provisioner-secret-missing",
			class: func(sc *storagev1.StorageClass) { sc.Parameters = secretParams("no-such-secret", "${pvc.namespace}") },
			want:  warning("no-such-secret", "not found"),
		},
		{
			name:      "size-zero",
			claim:     func(b *testutil.PVCBuilder) { b.Size("0") },
			createErr: []string{"spec.resources[storage]", "must be greater than zero"},
		},
		{
			name:  "size-over-driver-limit",
			claim: func(b *testutil.PVCBuilder) { b.Size("5Gi") },
			want:  warning("OutOfRange"),
		},
		{
			name:  "access-mode-rejected-by-driver",
			claim: func(b *testutil.PVCBuilder) { b.AccessModes(corev1.ReadWriteMany) },
			want:  warning("infeasible", "InvalidArgument"),
		},
		{
			name: "data-source-unknown-kind",
			claim: func(b *testutil.PVCBuilder) {
				group := "populator.example.com"
				b.DataSource(&group, "Widget", "w1")
			},
			want: event{corev1.EventTypeNormal, "Provisioning", []string{"Assuming an external populator will provision the volume"}},
		},
		{
			// This control plane serves no snapshot API: the lookup fails.
			name: "data-source-snapshot-not-found",
			claim: func(b *testutil.PVCBuilder) {
				group := "snapshot.storage.k8s.io"
				b.DataSource(&group, "VolumeSnapshot", "no-such-snapshot")
			},
			want: warning("error getting handle for DataSource Type VolumeSnapshot by Name no-such-snapshot", "error getting snapshot no-such-snapshot from api server"),
		},
		{
			name:       "data-source-claim-clone-invalid",
			custom:     cloneRow,
			newVolumes: 1, // the source
		},
		{
			// The example driver has no MODIFY_VOLUME.
			name:  "volume-attributes-class-driver-cannot-modify",
			claim: func(b *testutil.PVCBuilder) { b.VolumeAttributesClass("gold") },
			want:  vacWarning(warning),
		},
		{
			name:  "selector",
			claim: func(b *testutil.PVCBuilder) { b.Selector(map[string]string{"app": "x"}) },
			want:  warning("claim Selector is not supported"),
		},
		{
			name: "class-deleted-under-pending-claim",
			class: func(sc *storagev1.StorageClass) {
				m := storagev1.VolumeBindingWaitForFirstConsumer
				sc.VolumeBindingMode = &m
			},
			custom: classDeletedRow,
		},
		{
			// The claim asks this driver (annotation set by hand, or left
			// from a class since recreated for another provisioner) but
			// its class names another provisioner: neither provisions it.
			name:   "annotated-for-driver-class-of-another",
			class:  func(sc *storagev1.StorageClass) { sc.Provisioner = "other.example.com" },
			custom: annotatedForDriverRow,
		},
		{
			name:   "pv-claimref-edited-to-pending-claim",
			custom: claimRefToPendingRow,
		},
		{
			name:       "pv-claimref-edited-to-claim-bound-elsewhere",
			custom:     claimRefToBoundRow,
			newVolumes: 1, // the other claim's
		},
	}
}

func (s *stack) runAPIRow(t *testing.T, row apiRow) {
	before := s.volumeIDs(t)
	className := "bad-" + row.name
	s.class(t, className, row.class)
	switch {
	case row.custom != nil:
		row.custom(t, s, className)
	default:
		b := testutil.NewPVC(s.ns, row.name).Class(className)
		if row.claim != nil {
			row.claim(b)
		}
		c, err := s.createClaim(t.Context(), b)
		if row.createErr != nil {
			if err == nil || !apierrors.IsInvalid(err) || !containsAll(err.Error(), row.createErr) {
				t.Errorf("create claim: error %v, want Invalid containing %q", err, row.createErr)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		s.waitEvent(t, s.ns, string(c.UID), row.want)
		if got := s.getClaim(t, c.Name); got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
			t.Errorf("claim phase %s, volumeName %q; want Pending, unbound", got.Status.Phase, got.Spec.VolumeName)
		}
	}
	s.checkVolumes(t, before, row.newVolumes)
}

// cloneRow: clones that cannot be provisioned: from a claim that does not
// exist, and smaller than their Bound source. Each gets a Warning saying
// why and nothing is created for it.
func cloneRow(t *testing.T, s *stack, class string) {
	src := s.claim(t, testutil.NewPVC(s.ns, "clone-src").Class(class).Size("1Gi"))
	s.waitPhase(t, src.Name, corev1.ClaimBound)
	missing := s.claim(t, testutil.NewPVC(s.ns, "clone-of-nothing").Class(class).DataSource(nil, "PersistentVolumeClaim", "no-such-claim"))
	small := s.claim(t, testutil.NewPVC(s.ns, "clone-too-small").Class(class).Size("512Mi").DataSource(nil, "PersistentVolumeClaim", src.Name))
	s.waitEvent(t, s.ns, string(missing.UID), event{corev1.EventTypeWarning, "ProvisioningFailed", []string{`error getting PVC no-such-claim (namespace "` + s.ns + `")`}})
	s.waitEvent(t, s.ns, string(small.UID), event{corev1.EventTypeWarning, "ProvisioningFailed", []string{"new PVC request must be greater than or equal in size to the specified PVC data source"}})
	for _, c := range []*corev1.PersistentVolumeClaim{missing, small} {
		if got := s.getClaim(t, c.Name); got.Status.Phase != corev1.ClaimPending {
			t.Errorf("clone %s phase %s, want Pending", c.Name, got.Status.Phase)
		}
	}
}

// annotatedForDriverRow: a claim annotated for the stack's driver whose
// class names another provisioner gets a Warning naming both and stays
// Pending.
func annotatedForDriverRow(t *testing.T, s *stack, class string) {
	c := s.claim(t, testutil.NewPVC(s.ns, "annotated-for-driver").Class(class).
		Annotation("volume.kubernetes.io/storage-provisioner", s.driver.Name))
	s.waitEvent(t, s.ns, string(c.UID), event{corev1.EventTypeWarning, "ProvisioningFailed",
		[]string{"the claim is annotated for " + s.driver.Name, `names provisioner "other.example.com"`}})
	if got := s.getClaim(t, c.Name); got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
		t.Errorf("claim phase %s, volumeName %q; want Pending, unbound", got.Status.Phase, got.Spec.VolumeName)
	}
}

// classDeletedRow: a WaitForFirstConsumer claim waits; its class is
// deleted; the claim gets a Warning naming the missing class (reference
// §1.6 step 3: ProvisioningFailed with the lookup error) and is never
// provisioned.
func classDeletedRow(t *testing.T, s *stack, class string) {
	c := s.claim(t, testutil.NewPVC(s.ns, "class-deleted").Class(class))
	s.waitEvent(t, s.ns, string(c.UID), event{corev1.EventTypeNormal, "WaitForFirstConsumer", []string{"waiting for first consumer"}})
	if err := s.c.StorageV1().StorageClasses().Delete(t.Context(), class, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(t, s.ns, string(c.UID), event{corev1.EventTypeWarning, "ProvisioningFailed", []string{`"` + class + `"`, "not found"}})
	if got := s.getClaim(t, c.Name); got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
		t.Errorf("claim phase %s, volumeName %q; want Pending, unbound", got.Status.Phase, got.Spec.VolumeName)
	}
}

// pointClaimRef edits the PV by hand: its claimRef now names claim.
func (s *stack) pointClaimRef(t *testing.T, pvName string, claim *corev1.PersistentVolumeClaim) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pv, err := s.c.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
		_, err = s.c.CoreV1().PersistentVolumes().Update(t.Context(), pv, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// claimRefToPendingRow: claim A is Bound to PV-A; claim B (class "", so
// nobody provisions it) is Pending; PV-A's claimRef is edited to B.
// Reference §1.2.5: A's volume is claimed by another UID, so A becomes Lost
// with Warning ClaimMisbound. §1.3.5 and §3.2.8: B is unbound and PV-A is
// pre-bound to it, so B binds to PV-A (class not checked for a pre-bound
// PV). No volume is released or deleted while A or B exists; deleting A
// keeps PV-A; deleting B releases PV-A and deletes it with its volume.
func claimRefToPendingRow(t *testing.T, s *stack, class string) {
	done := s.record(t)
	a := s.claim(t, testutil.NewPVC(s.ns, "edit-a").Class(class))
	a = s.waitPhase(t, a.Name, corev1.ClaimBound)
	b := s.claim(t, testutil.NewPVC(s.ns, "edit-b").Class(""))
	pvName := a.Spec.VolumeName
	s.pointClaimRef(t, pvName, b)

	s.waitEvent(t, s.ns, string(a.UID), event{corev1.EventTypeWarning, "ClaimMisbound", []string{"Two claims are bound to the same volume, this one is bound incorrectly"}})
	s.waitPhase(t, a.Name, corev1.ClaimLost)
	if got := s.waitPhase(t, b.Name, corev1.ClaimBound); got.Spec.VolumeName != pvName {
		t.Errorf("claim %s bound to %q, want %s", b.Name, got.Spec.VolumeName, pvName)
	}
	pv, err := s.c.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Status.Phase != corev1.VolumeBound || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != b.UID {
		t.Errorf("pv %s: phase %s, claimRef %+v; want Bound to %s", pvName, pv.Status.Phase, pv.Spec.ClaimRef, b.Name)
	}
	handle := pv.Spec.CSI.VolumeHandle

	s.deleteClaim(t, a.Name)
	if pv, err := s.c.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{}); err != nil || pv.Status.Phase != corev1.VolumeBound {
		t.Errorf("after deleting the Lost claim, pv %s: %v, phase %v; want it Bound to %s", pvName, err, phaseOf(pv), b.Name)
	}
	s.deleteClaim(t, b.Name)
	s.waitPVGone(t, pvName, handle)
	// Two claims Bound to PV-A for a moment is allowed here: B may bind
	// before A's sync marks it Lost, as upstream.
	for _, v := range done() {
		if v.Object == "pv "+pvName && v.Invariant != chaos.InvNoDoubleBind {
			t.Errorf("history: %s", v)
		}
	}
}

// claimRefToBoundRow: claims A and B are Bound to PV-A and PV-B; PV-A's
// claimRef is edited to B. Reference §1.2.5: A becomes Lost with Warning
// ClaimMisbound. Upstream (§1.3.7) would then release PV-A, which is
// provisioned with policy Delete and whose claimRef claim is bound to
// another volume, and delete A's data while A still exists. This sidecar
// keeps PV-A and its volume while A is still bound to it, with a Warning on
// the PV; pointing the claimRef back at A rebinds A, and deleting A then
// reclaims PV-A. B stays Bound to PV-B throughout.
func claimRefToBoundRow(t *testing.T, s *stack, class string) {
	a := s.claim(t, testutil.NewPVC(s.ns, "edit2-a").Class(class))
	b := s.claim(t, testutil.NewPVC(s.ns, "edit2-b").Class(class))
	a = s.waitPhase(t, a.Name, corev1.ClaimBound)
	b = s.waitPhase(t, b.Name, corev1.ClaimBound)
	pv, err := s.c.CoreV1().PersistentVolumes().Get(t.Context(), a.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.pointClaimRef(t, pv.Name, b)
	s.waitEvent(t, s.ns, string(a.UID), event{corev1.EventTypeWarning, "ClaimMisbound", []string{"Two claims are bound to the same volume, this one is bound incorrectly"}})
	s.waitPhase(t, a.Name, corev1.ClaimLost)
	s.waitEvent(t, metav1.NamespaceDefault, string(pv.UID), event{corev1.EventTypeWarning, "VolumeStillInUse", []string{"claim " + s.ns + "/" + a.Name + ", which was bound to it before the claimRef changed, still uses it"}})
	got, err := s.c.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("PV-A deleted while claim A still uses it: %v", err)
	}
	if got.Status.Phase == corev1.VolumeReleased || got.DeletionTimestamp != nil {
		t.Errorf("PV-A phase %s, deleting %v; want kept", got.Status.Phase, got.DeletionTimestamp != nil)
	}
	if ids := s.volumeIDs(t); !slices.Contains(ids, pv.Spec.CSI.VolumeHandle) {
		t.Errorf("PV-A's volume %s is gone while claim A still uses it", pv.Spec.CSI.VolumeHandle)
	}
	if got := s.getClaim(t, b.Name); got.Status.Phase != corev1.ClaimBound || got.Spec.VolumeName != b.Spec.VolumeName {
		t.Errorf("claim %s: phase %s, volume %q; want Bound to %s", b.Name, got.Status.Phase, got.Spec.VolumeName, b.Spec.VolumeName)
	}
	// Undo the edit: A is bound again, and its deletion reclaims PV-A.
	s.pointClaimRef(t, pv.Name, a)
	s.waitPhase(t, a.Name, corev1.ClaimBound)
	s.deleteClaim(t, a.Name)
	s.waitPVGone(t, pv.Name, pv.Spec.CSI.VolumeHandle)
}

func (s *stack) deleteClaim(t *testing.T, name string) {
	t.Helper()
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(t, name)
}

// waitPVGone waits until the PV and its driver volume are gone.
func (s *stack) waitPVGone(t *testing.T, pvName, handle string) {
	t.Helper()
	testutil.Eventually(t, 0, "pv "+pvName+" and volume "+handle+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		for _, id := range s.volumeIDs(t) {
			if id == handle {
				return false, nil
			}
		}
		return true, nil
	})
}

// record starts a watch history of PVs and PVCs and returns done, which
// catches it up with a marker write, stops it and returns the history's
// violations.
func (s *stack) record(t *testing.T) func() []chaos.Violation {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	rec := chaos.NewRecorder(s.c)
	if err := rec.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	return func() []chaos.Violation {
		defer cancel()
		m := s.claim(t, testutil.NewPVC(s.ns, "history-marker").Class(""))
		rev, err := chaos.ParseRevision(m.ResourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "watch history did not catch up", func(context.Context) (bool, error) {
			return rec.LastRevision() >= rev, nil
		})
		return chaos.CheckHistory(rec.Records())
	}
}

func phaseOf(pv *corev1.PersistentVolume) corev1.PersistentVolumePhase {
	if pv == nil {
		return ""
	}
	return pv.Status.Phase
}

func containsAll(s string, fragments []string) bool {
	for _, f := range fragments {
		if !strings.Contains(s, f) {
			return false
		}
	}
	return true
}

// vacWarning is the Warning for a claim naming a VolumeAttributesClass the
// example driver cannot apply: before v1.34 (no v1 API) the sidecar says
// it cannot read the class, and never gets to the driver's capability.
func vacWarning(warning func(...string) event) event {
	if !vacServedV1 {
		return warning(`VolumeAttributesClass "gold" cannot be read: the API server does not serve storage.k8s.io/v1 VolumeAttributesClasses`)
	}
	return warning("CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported")
}
