package e2e

import (
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// End states a scenario waits for.
func claimGone(_ *delRun, st delState) bool { return st.claim == "gone" }

func bothGone(_ *delRun, st delState) bool { return st.claim == "gone" && st.pv == "gone" }

func released(_ *delRun, st delState) bool {
	return st.claim == "gone" && strings.HasPrefix(st.pv, "phase=Released ")
}

// Finalizers as objectState shows them.
const (
	claimProtected    = "[kubernetes.io/pvc-protection]"
	deleteSecretClass = "csi.storage.k8s.io/provisioner-secret-"
)

// secretClass names the provisioner (and so deletion) secret
// <claim>-creds in the claim's namespace.
func secretClass(b *testutil.SCBuilder) {
	b.Param(deleteSecretClass+"name", "${pvc.name}-creds").Param(deleteSecretClass+"namespace", "${pvc.namespace}")
}

func deleteClaim(r *delRun) { r.deleteClaim() }

// failing: the claim is gone, the PV Released, DeleteVolume was retried
// and failed with a Warning.
func failing(r *delRun, st delState) bool {
	return released(r, st) && st.calls >= 2 && slices.Contains(st.pvEvents, "Warning VolumeFailedDelete")
}

func delScenarios() []delScenario {
	retain := func(b *testutil.SCBuilder) { b.ReclaimPolicy(corev1.PersistentVolumeReclaimRetain) }
	return []delScenario{
		{name: "delete", steps: []delStep{{do: deleteClaim, done: bothGone, calls: 1}}},
		{name: "retain", class: retain, steps: []delStep{
			// The library adds its finalizer to every PV it creates and
			// takes it off a Retain PV at its next sync of the PV.
			{do: deleteClaim, done: func(r *delRun, st delState) bool {
				return released(r, st) && !strings.Contains(st.pv, libraryFinalizer)
			}},
			// An administrator lets the released volume go.
			{do: func(r *delRun) {
				r.patchPV(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
			}, done: bothGone, calls: 1},
		}},
		{name: "secrets", class: secretClass, secret: "secrets-creds", steps: []delStep{{do: deleteClaim, done: bothGone, calls: 1}}},
		{name: "missing-secret", class: secretClass, secret: "missing-secret-creds", steps: []delStep{{do: func(r *delRun) {
			if err := r.s.c.CoreV1().Secrets(r.s.ns).Delete(r.t.Context(), r.sc.secret, metav1.DeleteOptions{}); err != nil {
				r.t.Fatal(err)
			}
			r.deleteClaim()
		}, done: bothGone, calls: 1}}},
		{name: "class-deleted", class: secretClass, secret: "class-deleted-creds", steps: []delStep{{do: func(r *delRun) {
			if err := r.s.c.StorageV1().StorageClasses().Delete(r.t.Context(), r.class, metav1.DeleteOptions{}); err != nil {
				r.t.Fatal(err)
			}
			r.deleteClaim()
		}, done: bothGone, calls: 1}}},
		{name: "delete-fails", steps: []delStep{
			{do: func(r *delRun) {
				r.s.driver.failDelete(r.volumeID(), status.Error(codes.FailedPrecondition, "volume busy"), -1)
				r.deleteClaim()
			}, done: failing, retrying: true},
			// An administrator deletes the PV object meanwhile. Settled
			// once kube-controller-manager's pv-protection controller has
			// removed its finalizer (it does, the PV being unused), which
			// it may do on one side before the other looks.
			{do: func(r *delRun) { r.deletePV() }, done: func(r *delRun, st delState) bool {
				return failing(r, st) && strings.HasPrefix(st.pv, "phase=Released deleting=true ") &&
					!strings.Contains(st.pv, "kubernetes.io/pv-protection")
			}, retrying: true},
			{do: func(r *delRun) { r.s.driver.failDelete(r.volumeID(), nil, 0) }, done: bothGone, retrying: true},
		}},
		// An administrator keeps a volume whose deletion fails.
		{name: "delete-fails-retain", steps: []delStep{
			{do: func(r *delRun) {
				r.s.driver.failDelete(r.volumeID(), status.Error(codes.FailedPrecondition, "volume busy"), -1)
				r.deleteClaim()
			}, done: failing, retrying: true},
			{do: func(r *delRun) {
				r.patchPV(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
			}, done: func(r *delRun, st delState) bool {
				return released(r, st) && !strings.Contains(st.pv, libraryFinalizer)
			}, retrying: true},
		}},
		{name: "delete-transient", steps: []delStep{{do: func(r *delRun) {
			r.s.driver.failDelete(r.volumeID(), status.Error(codes.Unavailable, "backend restarting"), 1)
			r.deleteClaim()
		}, done: func(r *delRun, st delState) bool {
			// The event may be written after the PV is gone.
			return bothGone(r, st) && slices.Contains(st.pvEvents, "Warning VolumeFailedDelete")
		}, calls: 2}}},
		{name: "attached", steps: []delStep{
			{do: func(r *delRun) {
				r.attach()
				r.deleteClaim()
			}, done: func(r *delRun, st delState) bool {
				return released(r, st) && len(st.pvEvents) > 0
			}, differ: map[string]delDiffer{"pv events": {
				upstream: "[Warning VolumeFailedDelete]", ours: "[Normal VolumeDelete]",
				why: "README: one Normal VolumeDelete while the volume waits for its detach (upstream issue #1574)",
			}}},
			{do: func(r *delRun) { r.detach() }, done: bothGone, calls: 1, differ: map[string]delDiffer{"pv events": {
				upstream: "[Warning VolumeFailedDelete]", ours: "[Normal VolumeDelete]", why: "the first step's events",
			}}},
		}},
		{name: "pv-deleted", steps: []delStep{
			{do: func(r *delRun) { r.deletePV() }, done: func(_ *delRun, st delState) bool {
				return strings.HasPrefix(st.pv, "phase=Bound deleting=true")
			}},
			{do: deleteClaim, done: bothGone, calls: 1},
		}},
		// kubectl delete pvc,pv: both at once.
		{name: "claim-and-pv", steps: []delStep{{do: func(r *delRun) {
			r.deleteClaim()
			r.deletePV()
		}, done: bothGone, calls: 1}}},
		// A Retain PV deleted while Bound goes once released, its volume
		// kept.
		{name: "retain-pv-deleted", class: retain, steps: []delStep{
			{do: func(r *delRun) { r.deletePV() }, done: func(_ *delRun, st delState) bool {
				return strings.HasPrefix(st.pv, "phase=Bound deleting=true ") && !strings.Contains(st.pv, libraryFinalizer)
			}},
			{do: deleteClaim, done: bothGone},
		}},
		{name: "pod", pod: true, steps: []delStep{
			{do: deleteClaim, done: func(_ *delRun, st delState) bool {
				return st.claim == "phase=Bound deleting=true finalizers="+claimProtected
			}},
			{do: func(r *delRun) {
				if err := r.s.c.CoreV1().Pods(r.s.ns).Delete(r.t.Context(), r.sc.name, *metav1.NewDeleteOptions(0)); err != nil {
					r.t.Fatal(err)
				}
			}, done: bothGone, calls: 1},
		}},
		// A static volume has no deletion-secret annotations: its class
		// names the secret, resolved with the claimRef's name.
		{name: "static", static: true, class: secretClass, secret: "static-creds", steps: []delStep{{do: deleteClaim, done: bothGone, calls: 1}}},
		// The class names the secret with the keys every secret falls
		// back to, or with the deprecated ones.
		{name: "static-fallback-secret", static: true, secret: "static-fallback-secret-creds", class: func(b *testutil.SCBuilder) {
			b.Param("csi.storage.k8s.io/secret-name", "${pvc.name}-creds").Param("csi.storage.k8s.io/secret-namespace", "${pvc.namespace}")
		}, steps: []delStep{{do: deleteClaim, done: bothGone, calls: 1}}},
		{name: "static-deprecated-secret", static: true, secret: "static-deprecated-secret-creds", class: func(b *testutil.SCBuilder) {
			b.Param("csiProvisionerSecretName", "${pvc.name}-creds").Param("csiProvisionerSecretNamespace", "${pvc.namespace}")
		}, steps: []delStep{{do: deleteClaim, done: bothGone, calls: 1}}},
		{name: "static-class-deleted", static: true, class: secretClass, secret: "static-class-deleted-creds", steps: []delStep{{do: func(r *delRun) {
			if err := r.s.c.StorageV1().StorageClasses().Delete(r.t.Context(), r.class, metav1.DeleteOptions{}); err != nil {
				r.t.Fatal(err)
			}
			r.deleteClaim()
		}, done: bothGone, calls: 1}}},
		// A claim annotation in the secret's name cannot be resolved from
		// the claimRef: the volume is not deleted, with a Warning.
		{name: "static-annotation-secret", static: true, class: func(b *testutil.SCBuilder) {
			b.Param(deleteSecretClass+"name", "${pvc.annotations['team']}-creds").Param(deleteSecretClass+"namespace", "${pvc.namespace}")
		}, steps: []delStep{{do: deleteClaim, done: func(r *delRun, st delState) bool {
			return released(r, st) && slices.Contains(st.pvEvents, "Warning VolumeFailedDelete")
		}}}},
		{name: "other-driver", other: true, steps: []delStep{{do: deleteClaim, done: func(r *delRun, st delState) bool {
			return claimGone(r, st) && (!r.upstream || strings.HasPrefix(st.pv, "phase=Released "))
		}, differ: map[string]delDiffer{"pv": {
			upstream: "phase=Released deleting=false finalizers=[kubernetes.io/pv-protection]",
			ours:     "phase=Bound deleting=false finalizers=[kubernetes.io/pv-protection]",
			why:      "README, --enable-binder: the binder binds and reclaims this driver's volumes only",
		}}}}},
	}
}

// patchPV applies a merge patch to the scenario's PV.
func (r *delRun) patchPV(patch string) {
	if _, err := r.s.c.CoreV1().PersistentVolumes().Patch(r.t.Context(), r.pv.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// deletePV deletes the scenario's PV object.
func (r *delRun) deletePV() {
	if err := r.s.c.CoreV1().PersistentVolumes().Delete(r.t.Context(), r.pv.Name, metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// detach deletes the VolumeAttachment attach created.
func (r *delRun) detach() {
	if err := r.s.c.StorageV1().VolumeAttachments().Delete(r.t.Context(), r.s.ns+"-"+r.sc.name, metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
}
