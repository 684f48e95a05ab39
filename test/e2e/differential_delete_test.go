package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// The test in this file checks the drop-in promise for deletion and
// reclaim, request by request: the same claims and volumes, deleted the same
// way, once under upstream external-provisioner v6.3.0 with
// kube-controller-manager's binder, once under this sidecar with its own
// binder (the default deployment; kube-controller-manager runs only its
// protection controllers). The scenarios are in
// differential_delete_cases_test.go.

// delScenario is one claim (provisioned, or bound to a static volume) and
// the steps that delete it, applied on both sides.
type delScenario struct {
	name string
	// class changes the scenario's class.
	class func(*testutil.SCBuilder)
	// secret names a Secret (user=u, token=t) created before the claim.
	secret string
	// static: the claim binds a static volume of the driver (handle
	// "static-<scenario>", no provisioned-by annotation, the scenario's class,
	// pre-bound to the claim by name); other: a volume of another driver,
	// which the test binds to the claim by hand.
	static, other bool
	// pod: a Pod object (no kubelet runs) scheduled to diff-n1 uses the
	// claim before the first step.
	pod   bool
	steps []delStep
}

// delStep is one step: do on each side, then wait until done on each side,
// then compare.
type delStep struct {
	do   func(r *delRun)
	done func(r *delRun, st delState) bool
	// calls is the number of DeleteVolume calls this sidecar must have
	// made for the volume by the end of the step; retrying: at least two.
	// Upstream must have made at least as many (it may repeat a call that
	// succeeded, issue #1235, README).
	calls    int
	retrying bool
	// differ lists the deliberate differences of the step, by key.
	differ map[string]delDiffer
}

// delDiffer is one deliberate difference: upstream's value, ours, and why.
type delDiffer struct{ upstream, ours, why string }

// delState is what a user and the driver see of one scenario on one side.
type delState struct {
	claim, pv             string
	claimEvents, pvEvents []string
	// deletes are the distinct DeleteVolumeRequests, normalised; calls
	// their number with repeats.
	deletes []string
	calls   int
}

func (st delState) keys() map[string]string {
	return map[string]string{
		"claim":        st.claim,
		"pv":           st.pv,
		"claim events": "[" + strings.Join(st.claimEvents, ", ") + "]",
		"pv events":    "[" + strings.Join(st.pvEvents, ", ") + "]",
		"deletes":      "[" + strings.Join(st.deletes, ", ") + "]",
	}
}

// TestDifferentialDelete applies each scenario of delScenarios to upstream
// external-provisioner v6.3.0 next to kube-controller-manager's binder (a
// control plane of its own) and to this sidecar with its binder (the shared
// control plane, where kube-controller-manager runs only the protection
// controllers), each with a recording driver. After each step both sides
// settle (the step's done condition) and the test compares the
// DeleteVolumeRequests the driver got (volume, secrets, number of calls),
// the end state of the PV and of the claim (phase, being deleted,
// finalizers, or gone) and the type and reason of the events on each
// (messages may differ; they are logged). A difference is a failure unless
// the step lists it with its reason.
func TestDifferentialDelete(t *testing.T) {
	cp := controlplane.Need(t, shared)
	upBin, ourBin := diffBinaries(t)
	kcm := controlplane.StartForTest(t, controlplane.ReferenceBinderConfig())
	g := diffGroup{name: "delete", publish: true}
	up := startDiffSide(t, kcm, "upstream", upBin, g)
	ours := startDiffSide(t, cp, "ours", ourBin, g)
	t.Run("scenarios", func(t *testing.T) {
		for _, sc := range delScenarios() {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				runs := []*delRun{newDelRun(t, up, &sc, true), newDelRun(t, ours, &sc, false)}
				for _, r := range runs {
					r.setUp()
				}
				for i, step := range sc.steps {
					for _, r := range runs {
						step.do(r)
					}
					states := make([]delState, len(runs))
					for j, r := range runs {
						states[j] = r.settle(step)
					}
					for _, msg := range compareDelete(step, states[0], states[1]) {
						t.Errorf("step %d: %s", i, msg)
					}
					for j, r := range runs {
						t.Logf("step %d %s: %v; events: %s", i, r.s.ns, states[j].keys(), r.eventMessages())
					}
				}
			})
		}
	})
}

// compareDelete reports every key whose value differs between the sides
// and is not a deliberate difference, every deliberate difference that is
// not what the step says, and DeleteVolume call counts that are not what
// the step says.
func compareDelete(step delStep, up, ours delState) []string {
	var errs []string
	u, o := up.keys(), ours.keys()
	for _, k := range slices.Sorted(maps.Keys(u)) {
		if d, ok := step.differ[k]; ok {
			if u[k] != d.upstream || o[k] != d.ours {
				errs = append(errs, fmt.Sprintf("%s: expected difference (%s) is now\n\tupstream: %s\n\tours:     %s", k, d.why, u[k], o[k]))
			}
			continue
		}
		if u[k] != o[k] {
			errs = append(errs, fmt.Sprintf("%s:\n\tupstream: %s\n\tours:     %s", k, u[k], o[k]))
		}
	}
	switch {
	case step.retrying && (ours.calls < 2 || up.calls < 2):
		errs = append(errs, fmt.Sprintf("DeleteVolume calls: upstream %d, ours %d, want at least 2 each (retried)", up.calls, ours.calls))
	case !step.retrying && (ours.calls != step.calls || up.calls < step.calls):
		errs = append(errs, fmt.Sprintf("DeleteVolume calls: upstream %d, ours %d, want %d", up.calls, ours.calls, step.calls))
	}
	return errs
}

// delRun is one scenario on one side.
type delRun struct {
	t        *testing.T
	s        *diffSide
	sc       *delScenario
	upstream bool
	class    string
	claim    *corev1.PersistentVolumeClaim
	pv       *corev1.PersistentVolume
}

func newDelRun(t *testing.T, s *diffSide, sc *delScenario, upstream bool) *delRun {
	r := &delRun{t: t, s: s, sc: sc, upstream: upstream, class: s.ns + "-" + sc.name}
	t.Cleanup(r.cleanup)
	return r
}

// volumeID is the ID of the scenario's volume in the driver.
func (r *delRun) volumeID() string { return r.pv.Spec.CSI.VolumeHandle }

// setUp creates the scenario's class, secret, claim (and volume) and pod,
// and waits until the claim is Bound and, for a volume of the driver with
// policy Delete, the PV has the library's finalizer (upstream's library
// adds it only to a Bound volume not being deleted).
func (r *delRun) setUp() {
	t, ctx, c, ns := r.t, r.t.Context(), r.s.c, r.s.ns
	b := testutil.NewSC(r.class, r.s.driver.name)
	if r.sc.class != nil {
		r.sc.class(b)
	}
	sc := b.Obj()
	sc.UID, sc.ResourceVersion = "", ""
	if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r.sc.secret != "" {
		if _, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: r.sc.secret},
			StringData: map[string]string{"user": "u", "token": "t"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claim := testutil.NewPVC(ns, r.sc.name).Class(r.class).RV("")
	pvName := ns + "-" + r.sc.name
	switch {
	case r.sc.static:
		pv := testutil.NewPV(pvName, r.s.driver.name).Class(r.class).RV("").ClaimRef(ns, r.sc.name, "").Obj()
		pv.Spec.CSI.VolumeHandle = "static-" + r.sc.name
		pv.Status = corev1.PersistentVolumeStatus{}
		if _, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// A binder that syncs the claim before its cache has the volume
		// hands the claim to the provisioner (kube-controller-manager
		// does): the claim would get a provisioned volume instead, or a
		// ProvisioningFailed. The binder marks the volume Available once
		// it has seen it.
		testutil.Eventually(t, time.Minute, ns+": volume "+pvName+" not Available", func(ctx context.Context) (bool, error) {
			got, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
			return err == nil && got.Status.Phase == corev1.VolumeAvailable, err
		})
	case r.sc.other:
		claim.Class("").VolumeName(pvName)
	}
	created, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim.Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.claim = created
	if r.sc.other {
		r.bindOther(pvName)
	}
	if r.sc.pod {
		pod := testutil.NewPod(ns, r.sc.name, "diff-n1", r.sc.name)
		pod.ResourceVersion, pod.Status = "", corev1.PodStatus{}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, time.Minute, ns+": claim "+r.sc.name+" not Bound", func(ctx context.Context) (bool, error) {
		got, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, r.sc.name, metav1.GetOptions{})
		if err != nil || got.Status.Phase != corev1.ClaimBound {
			return false, err
		}
		pv, err := c.CoreV1().PersistentVolumes().Get(ctx, got.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Status.Phase != corev1.VolumeBound {
			return false, ignoreNotFound(err)
		}
		r.claim, r.pv = got, pv
		ours := pv.Spec.CSI.Driver == r.s.driver.name && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete
		return !ours || slices.Contains(pv.Finalizers, libraryFinalizer), nil
	})
	if r.sc.pod {
		// kubernetes.io/pvc-protection is added when the claim is
		// created; the pod keeps it once the claim is deleted.
		testutil.Eventually(t, time.Minute, ns+": claim "+r.sc.name+" without pvc-protection", func(ctx context.Context) (bool, error) {
			got, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, r.sc.name, metav1.GetOptions{})
			return err == nil && slices.Contains(got.Finalizers, "kubernetes.io/pvc-protection"), err
		})
	}
}

// bindOther creates a volume of another driver bound to the claim, and
// completes the binding as a binder would: kube-controller-manager's would
// bind it, this sidecar's leaves other drivers' volumes alone.
func (r *delRun) bindOther(pvName string) {
	t, ctx, c := r.t, r.t.Context(), r.s.c
	pv := testutil.NewPV(pvName, "other.csi.kube-storage.io").Class("").RV("").BoundTo(r.claim).
		Annotation("pv.kubernetes.io/bound-by-controller", "yes").Obj()
	pv.Status = corev1.PersistentVolumeStatus{}
	pv, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Status.Phase = corev1.VolumeBound
	if _, err := c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		t.Fatal(err)
	}
	claim := r.claim.DeepCopy()
	claim.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
	claim, err = c.CoreV1().PersistentVolumeClaims(r.s.ns).Update(ctx, claim, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsConflict(err) {
		t.Fatal(err)
	}
	if err == nil {
		claim.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, AccessModes: pv.Spec.AccessModes, Capacity: pv.Spec.Capacity}
		if _, err := c.CoreV1().PersistentVolumeClaims(r.s.ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

// settle waits until the step is done on this side, and returns the state.
func (r *delRun) settle(step delStep) delState {
	var st delState
	testutil.Eventually(r.t, time.Minute, r.s.ns+": "+r.sc.name+" did not settle", func(ctx context.Context) (bool, error) {
		var err error
		st, err = r.state(ctx)
		return err == nil && step.done(r, st), err
	})
	return st
}

// state reads the scenario's state on this side.
func (r *delRun) state(ctx context.Context) (delState, error) {
	c := r.s.c
	st := delState{claim: "gone", pv: "gone"}
	claim, err := c.CoreV1().PersistentVolumeClaims(r.s.ns).Get(ctx, r.claim.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		st.claim = objectState(string(claim.Status.Phase), claim.ObjectMeta)
	case !apierrors.IsNotFound(err):
		return st, err
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, r.pv.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		st.pv = objectState(string(pv.Status.Phase), pv.ObjectMeta)
	case !apierrors.IsNotFound(err):
		return st, err
	}
	if st.claimEvents, err = r.events(ctx, r.s.ns, r.claim.UID, true); err != nil {
		return st, err
	}
	if st.pvEvents, err = r.events(ctx, "", r.pv.UID, true); err != nil {
		return st, err
	}
	reqs := r.s.driver.deleteRequests(r.volumeID())
	st.calls = len(reqs)
	for _, req := range reqs {
		if s := r.normalise(describeDelete(req)); !slices.Contains(st.deletes, s) {
			st.deletes = append(st.deletes, s)
		}
	}
	return st, nil
}

// provisioningReasons are the events of provisioning, compared by
// TestDifferentialCreateVolume and the README; not of deletion.
var provisioningReasons = []string{"Provisioning", "ProvisioningSucceeded", "ExternalProvisioning"}

// events returns the distinct "type reason" (or, when !short, "type
// reason: message") of the events about uid, sorted.
func (r *delRun) events(ctx context.Context, ns string, uid types.UID, short bool) ([]string, error) {
	list, err := r.s.c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(uid)})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		if slices.Contains(provisioningReasons, e.Reason) || classRaced(ctx, r.s.c, e) {
			continue
		}
		s := e.Type + " " + e.Reason
		if !short {
			s = r.normalise(fmt.Sprintf("%s: %s (x%d)", s, e.Message, max(e.Count, 1)))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out, nil
}

// eventMessages returns the events of the claim and the PV with their
// messages, for the log.
func (r *delRun) eventMessages() string {
	ctx := context.Background()
	claim, _ := r.events(ctx, r.s.ns, r.claim.UID, false)
	pv, _ := r.events(ctx, "", r.pv.UID, false)
	return fmt.Sprintf("claim %v, pv %v", claim, pv)
}

// objectState is the phase, whether the object is being deleted, and its
// finalizers, sorted.
func objectState(phase string, meta metav1.ObjectMeta) string {
	f := slices.Sorted(slices.Values(meta.Finalizers))
	return fmt.Sprintf("phase=%s deleting=%t finalizers=%v", phase, meta.DeletionTimestamp != nil, f)
}

// describeDelete is the request's volume ID and secrets.
func describeDelete(req *csi.DeleteVolumeRequest) string {
	var secrets []string
	for _, k := range slices.Sorted(maps.Keys(req.GetSecrets())) {
		secrets = append(secrets, k+"="+req.GetSecrets()[k])
	}
	return fmt.Sprintf("%s secrets=%v", req.GetVolumeId(), secrets)
}

// normalise replaces what differs between the sides: the claim's UID, the
// namespace and the driver.
func (r *delRun) normalise(text string) string {
	text = strings.ReplaceAll(text, string(r.claim.UID), "UID")
	text = strings.ReplaceAll(text, r.s.driver.name, "DRIVER")
	return strings.ReplaceAll(text, r.s.ns, "NS")
}

// deleteClaim deletes the scenario's claim.
func (r *delRun) deleteClaim() {
	if err := r.s.c.CoreV1().PersistentVolumeClaims(r.s.ns).Delete(r.t.Context(), r.claim.Name, metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// cleanup deletes what the scenario created on this side, finalizers and
// all; the side's cleanup deletes the rest.
func (r *delRun) cleanup() {
	ctx, c := context.Background(), r.s.c
	_ = c.CoreV1().Pods(r.s.ns).Delete(ctx, r.sc.name, *metav1.NewDeleteOptions(0))
	_ = c.StorageV1().VolumeAttachments().Delete(ctx, r.s.ns+"-"+r.sc.name, metav1.DeleteOptions{})
	if r.claim != nil {
		_, _ = c.CoreV1().PersistentVolumeClaims(r.s.ns).Patch(ctx, r.claim.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		_ = c.CoreV1().PersistentVolumeClaims(r.s.ns).Delete(ctx, r.claim.Name, metav1.DeleteOptions{})
	}
	pvName := r.s.ns + "-" + r.sc.name
	if r.pv != nil {
		pvName = r.pv.Name
	}
	_, _ = c.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	_ = c.CoreV1().PersistentVolumes().Delete(ctx, pvName, metav1.DeleteOptions{})
	_ = c.StorageV1().StorageClasses().Delete(ctx, r.class, metav1.DeleteOptions{})
}

// attach creates a VolumeAttachment of the scenario's PV to diff-n1 (no
// attacher runs: it stays unattached, which counts for both sidecars).
func (r *delRun) attach() {
	name := r.pv.Name
	if _, err := r.s.c.StorageV1().VolumeAttachments().Create(r.t.Context(), &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: r.s.ns + "-" + r.sc.name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: r.s.driver.name, NodeName: "diff-n1",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &name},
		},
	}, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}
