package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// TestSidecarExternalProvisioningEvent: with the real sidecar and a driver
// whose CreateVolume takes 8s, a claim handed to the provisioner that is
// still unbound after the binder's provisioning grace (twice
// --binder-resync-period: 2s) gets one Normal ExternalProvisioning event,
// not before the grace, with upstream's message; it then binds, and its
// resyncs while it waited did not post the event again.
func TestSidecarExternalProvisioningEvent(t *testing.T) {
	const grace = 2 * time.Second
	e := newEnv(t, controlplane.Need(t, shared))
	s := e.startStackWith(stackConfig{
		driver: e2e.DriverConfig{Args: []string{"--create-latency=8s"}},
		sidecarArgs: []string{"-v=4", "--binder-resync-period=1s", "--retry-interval-start=200ms", "--retry-interval-max=2s",
			"--timeout=1m"},
	})
	sc := e.createClass(testutil.NewSC(e.name("slow"), e.driver))
	claim := e.createClaim(testutil.NewPVC(e.ns, "slow").Class(sc.Name))

	e.waitClaimEvent(claim, corev1.EventTypeNormal, "ExternalProvisioning", "Waiting for a volume to be created either by the external provisioner '"+
		e.driver+"' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.")

	pvc := e.waitClaim(claim.Name, "Bound", isBound)
	pv := e.getPV(pvc.Spec.VolumeName)
	checkBound(t, pvc, pv, true, false)
	s.waitVolumeIDs(pv.Spec.CSI.VolumeHandle)

	list, err := e.c.CoreV1().Events(e.ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(claim.UID)})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range list.Items {
		if ev.Reason != "ExternalProvisioning" {
			continue
		}
		n++
		// Timestamps are whole seconds; the binder measures the claim's age
		// from its (whole-second) creation timestamp too.
		waited := ev.FirstTimestamp.Sub(claim.CreationTimestamp.Time)
		t.Logf("ExternalProvisioning event %s: %s after the claim's creation, count %d", ev.Name, waited, ev.Count)
		if waited < grace || ev.Count != 1 {
			t.Errorf("ExternalProvisioning event %s: %s after the claim's creation, count %d; want at least %s (the grace), count 1",
				ev.Name, waited, ev.Count, grace)
		}
	}
	if n != 1 {
		t.Errorf("%d ExternalProvisioning events, want 1", n)
	}
}

// TestBinderWaitForPodScheduled: a claim of a WaitForFirstConsumer class says
// what it waits for: a first consumer while no pod uses it, then the one
// pod that uses it and is not scheduled (a scheduled pod does not count),
// then both such pods, sorted. No scheduler runs here, so the pods stay
// unscheduled and the claim stays Pending, not handed to the provisioner.
func TestBinderWaitForPodScheduled(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	rb := e.startBinder(binderConfig{})
	sc := e.createClass(testutil.NewSC(e.name("wffc"), e.driver).WaitForFirstConsumer())
	claim := e.createClaim(testutil.NewPVC(e.ns, "data").Class(sc.Name))
	e.waitClaimEvent(claim, corev1.EventTypeNormal, "WaitForFirstConsumer", "waiting for first consumer to be created before binding")

	createPod := func(name, node string) {
		t.Helper()
		pod := testutil.NewPod(e.ns, name, node, claim.Name)
		pod.ResourceVersion, pod.Status = "", corev1.PodStatus{}
		if _, err := e.c.CoreV1().Pods(e.ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createPod("scheduled", "node-"+e.ns)
	createPod("web-b", "")
	e.waitClaimEvent(claim, corev1.EventTypeNormal, "WaitForPodScheduled", "waiting for pod web-b to be scheduled")
	createPod("web-a", "")
	e.waitClaimEvent(claim, corev1.EventTypeNormal, "WaitForPodScheduled", "waiting for pods web-a,web-b to be scheduled",
		"waiting for pod web-b to be scheduled")

	rb.waitResyncs(t, 2)
	got := e.getClaim(claim.Name)
	if got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" || metav1.HasAnnotation(got.ObjectMeta, annStorageProv) {
		t.Errorf("claim: phase %s, volumeName %q, annotations %v; want Pending, no volume, not handed to the provisioner",
			got.Status.Phase, got.Spec.VolumeName, got.Annotations)
	}
}

// TestBinderPreBoundMismatch: a claim pre-bound (spec.volumeName) to a
// volume it cannot have gets a Warning that says why: the volume is bound
// to another claim or does not exist (FailedBinding), or it is too small, of another class,
// without the claim's access mode or of another volume mode
// (VolumeMismatch "Cannot bind to requested volume"). A volume pre-bound
// (claimRef with UID) to a claim of another volume mode gets a
// VolumeMismatch on both objects. Over later resyncs each claim stays
// Pending with its spec.volumeName, and no volume is written.
func TestBinderPreBoundMismatch(t *testing.T) {
	e := newEnv(t, controlplane.Need(t, shared))
	// No provisioner runs: the claim without spec.volumeName is handed to
	// the provisioner without the in-flight finalizer.
	rb := e.startBinder(binderConfig{opts: []binder.Option{binder.WithProvisionCheck(refuseProvision{})}})
	sc := e.createClass(testutil.NewSC(e.name("sc"), e.driver))
	other := e.createClass(testutil.NewSC(e.name("other"), e.driver))
	newPV := func(suffix string) *testutil.PVBuilder {
		return testutil.NewPV(e.name(suffix), e.driver).Class(sc.Name).Size("5Gi")
	}

	taken := e.createPV(newPV("taken").ClaimRef(e.ns, "owner", ""))
	owner := e.createClaim(testutil.NewPVC(e.ns, "owner").Class(sc.Name))
	e.waitClaim(owner.Name, "Bound", isBound)
	e.waitPVPhase(taken.Name, corev1.VolumeBound)

	requested := []*corev1.PersistentVolume{
		e.createPV(newPV("small").Size("1Gi")),
		e.createPV(newPV("other-class").Class(other.Name)),
		e.createPV(newPV("rox").AccessModes(rox)),
		e.createPV(newPV("block").Block()),
	}
	// resourceVersion of each volume once the binder has nothing left to do.
	rvs := map[string]string{taken.Name: e.getPV(taken.Name).ResourceVersion}
	for _, v := range requested {
		rvs[v.Name] = e.waitPVPhase(v.Name, corev1.VolumeAvailable).ResourceVersion
	}

	// A class of their own, or the claim would take one of the volumes
	// above.
	modes := e.createClass(testutil.NewSC(e.name("modes"), e.driver))
	fsClaim := e.createClaim(testutil.NewPVC(e.ns, "filesystem").Class(modes.Name))
	blockPV := e.createPV(newPV("prebound-block").Class(modes.Name).Block().BoundTo(fsClaim))
	rvs[blockPV.Name] = blockPV.ResourceVersion

	for _, tc := range []struct {
		claim   *testutil.PVCBuilder
		reason  string
		message string
	}{
		{testutil.NewPVC(e.ns, "intruder").VolumeName(taken.Name), "FailedBinding",
			fmt.Sprintf("volume %q already bound to a different claim.", taken.Name)},
		{testutil.NewPVC(e.ns, "too-big").VolumeName(e.name("small")).Size("2Gi"), "VolumeMismatch",
			fmt.Sprintf("Cannot bind to requested volume %q: requested PV is too small", e.name("small"))},
		{testutil.NewPVC(e.ns, "wrong-class").VolumeName(e.name("other-class")), "VolumeMismatch",
			fmt.Sprintf("Cannot bind to requested volume %q: storageClassName does not match", e.name("other-class"))},
		{testutil.NewPVC(e.ns, "wrong-access").VolumeName(e.name("rox")), "VolumeMismatch",
			fmt.Sprintf("Cannot bind to requested volume %q: incompatible accessMode", e.name("rox"))},
		{testutil.NewPVC(e.ns, "wrong-mode").VolumeName(e.name("block")), "VolumeMismatch",
			fmt.Sprintf("Cannot bind to requested volume %q: incompatible volumeMode", e.name("block"))},
		{testutil.NewPVC(e.ns, "no-volume").VolumeName(e.name("missing")), "FailedBinding",
			fmt.Sprintf("Cannot bind to requested volume %q: the volume does not exist", e.name("missing"))},
	} {
		c := e.createClaim(tc.claim.Class(sc.Name))
		e.waitClaimEvent(c, corev1.EventTypeWarning, tc.reason, tc.message)
	}
	e.waitEvent(blockPV.UID, corev1.EventTypeWarning, "VolumeMismatch",
		fmt.Sprintf("Cannot bind PersistentVolume to requested PersistentVolumeClaim %q due to incompatible volumeMode.", e.ns+"/"+fsClaim.Name))
	e.waitClaimEvent(fsClaim, corev1.EventTypeWarning, "VolumeMismatch",
		fmt.Sprintf("Cannot bind PersistentVolume %q to requested PersistentVolumeClaim due to incompatible volumeMode.", blockPV.Name))

	// It stays so over later resyncs.
	rb.waitResyncs(t, 2)
	claims, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		if c.Name == owner.Name {
			checkBound(t, &c, e.getPV(taken.Name), true, false)
			continue
		}
		if c.Status.Phase != corev1.ClaimPending || metav1.HasAnnotation(c.ObjectMeta, annBindCompleted) {
			t.Errorf("claim %s: phase %s, annotations %v; want Pending, not bind-completed", c.Name, c.Status.Phase, c.Annotations)
		}
		if c.Name == fsClaim.Name && c.Spec.VolumeName != "" {
			t.Errorf("claim %s: volumeName %q, want none", c.Name, c.Spec.VolumeName)
		}
	}
	for name, rv := range rvs {
		if got := e.getPV(name); got.ResourceVersion != rv {
			t.Errorf("PV %s was written: resourceVersion %s -> %s (phase %s, claimRef %+v)", name, rv, got.ResourceVersion, got.Status.Phase, got.Spec.ClaimRef)
		}
	}
}

// waitClaimEvent waits until the claim has the event "eventType reason:
// message". It fails at once if the claim gets bound meanwhile, or if it
// has an event of that type and reason whose message is neither message
// nor one of earlier.
func (e *env) waitClaimEvent(claim *corev1.PersistentVolumeClaim, eventType, reason, message string, earlier ...string) {
	e.t.Helper()
	prefix := eventType + " " + reason + ": "
	want := prefix + message
	var last []string
	testutil.Eventually(e.t, 0, fmt.Sprintf("claim %s: no event %q", claim.Name, want), func(ctx context.Context) (bool, error) {
		evs, err := e.events(ctx, claim.UID)
		if err != nil {
			return false, err
		}
		last = evs
		found := false
		for _, ev := range evs {
			switch {
			case ev == want:
				found = true
			case strings.HasPrefix(ev, prefix) && !slices.Contains(earlier, strings.TrimPrefix(ev, prefix)):
				return false, fmt.Errorf("unexpected event %q", ev)
			}
		}
		if found {
			return true, nil
		}
		cur, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if cur.Spec.VolumeName != "" && metav1.HasAnnotation(cur.ObjectMeta, annBindCompleted) {
			return false, fmt.Errorf("claim bound to %s (events %q)", cur.Spec.VolumeName, evs)
		}
		return false, nil
	})
	e.t.Logf("events of claim %s: %q", claim.Name, last)
}
