package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// switchSecret is the provisioner secret both classes of a switchover test
// name; the driver refuses CreateVolume and DeleteVolume without it, so a
// provisioner that loses the deletion-secret annotations of the other's
// volumes cannot delete them.
const switchSecret = "provisioner-secret"

// switchover is one driver (kept running) and the provisioners that take
// turns serving it, upstream external-provisioner and this sidecar, on a
// control plane whose kube-controller-manager runs its PV binder, as a
// cluster running upstream does.
type switchover struct {
	*env
	driver   *e2e.Driver
	dir      string
	upstream string
	ours     string
	imm, wfc string // class names
	// created counts the provisioners started, to name their logs.
	created int
}

// newSwitchover starts the control plane, the driver (topology on, node
// registered, secrets required, every CreateVolume slowed by 1s so that
// one can be caught in flight) and the classes. It starts no provisioner.
func newSwitchover(t *testing.T) *switchover {
	t.Helper()
	upstream, err := e2e.UpstreamProvisioner()
	if err != nil {
		if os.Getenv(controlplane.RequireEnv) != "" || !errors.Is(err, controlplane.ErrBinariesMissing) {
			t.Fatalf("the switchover tests need upstream external-provisioner (hack/tools/build.sh external-provisioner): %v", err)
		}
		t.Skipf("switchover test skipped: %v", err)
	}
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	ctx := t.Context()
	bins, err := e2e.Build(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	s := &switchover{env: newEnv(t, cp), dir: t.TempDir(), upstream: upstream, ours: bins.Sidecar}
	s.driver, err = e2e.StartDriver(ctx, bins.Driver, e2e.DriverConfig{
		Dir: s.dir, Name: s.env.driver, Memory: true, Topology: true,
		Args: []string{"-v=4", "--create-latency=1s", "--require-create-secret=key=value", "--require-delete-secret=key=value"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.driver.Stop(5 * time.Second) })
	if err := s.driver.RegisterNode(ctx, s.c); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: switchSecret, Namespace: s.ns}, StringData: map[string]string{"key": "value"}}
	if _, err := s.c.CoreV1().Secrets(s.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	withSecret := func(b *testutil.SCBuilder) *testutil.SCBuilder {
		return b.Param("tier", "fast").Param("csi.storage.k8s.io/fstype", "xfs").
			Param("csi.storage.k8s.io/provisioner-secret-name", switchSecret).
			Param("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}")
	}
	s.imm = s.createClass(withSecret(testutil.NewSC(s.name("imm"), s.env.driver))).Name
	s.wfc = s.createClass(withSecret(testutil.NewSC(s.name("wfc"), s.env.driver)).WaitForFirstConsumer()).Name
	return s
}

// start starts a provisioner binary (upstream's or ours) for the driver
// and waits until it runs its controller. It stops when the test ends.
// Both get --extra-create-metadata, so that a CreateVolume one repeats
// for the other matches the driver's volume only if both send the same
// parameters.
func (s *switchover) start(bin string, args ...string) *e2e.Sidecar {
	s.t.Helper()
	s.created++
	args = append([]string{"-v=4", "--extra-create-metadata", "--retry-interval-start=200ms", "--retry-interval-max=2s"}, args...)
	p, err := e2e.StartSidecar(bin, e2e.SidecarConfig{
		Kubeconfig: s.cp.KubeconfigPath, Socket: s.driver.Socket,
		LogPath: filepath.Join(s.dir, fmt.Sprintf("provisioner-%d-%s.log", s.created, filepath.Base(filepath.Dir(bin)))),
		Args:    args,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	p.StopAtCleanup(s.t, s.driver)
	if err := p.WaitLog(s.t.Context(), "Started provisioner controller"); err != nil {
		s.t.Fatal(err)
	}
	return p
}

func (s *switchover) startUpstream() *e2e.Sidecar { return s.start(s.upstream) }

func (s *switchover) startOurs() *e2e.Sidecar {
	return s.start(s.ours, "--binder-resync-period=1s")
}

// kill SIGKILLs a provisioner, as a node failure or a forced rollout would.
func (s *switchover) kill(p *e2e.Sidecar) {
	s.t.Helper()
	if err := p.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatal(err)
	}
	if err := p.WaitExit(s.t.Context()); err == nil {
		s.t.Fatal("provisioner exited cleanly after SIGKILL")
	}
}

// boundClaims creates n claims of class named prefix-<i> and waits until
// they are Bound.
func (s *switchover) boundClaims(prefix, class string, n int) {
	s.t.Helper()
	for i := range n {
		s.createClaim(testutil.NewPVC(s.ns, fmt.Sprintf("%s-%d", prefix, i)).Class(class))
	}
	for i := range n {
		s.waitClaimPhase(fmt.Sprintf("%s-%d", prefix, i), corev1.ClaimBound)
	}
}

// createInFlight creates Immediate claims and waits until the driver has
// created their volumes, whose CreateVolume answers the driver holds back:
// no PV exists for them yet. want is the number of driver volumes with
// them.
func (s *switchover) createInFlight(want int, names ...string) []*corev1.PersistentVolumeClaim {
	s.t.Helper()
	var claims []*corev1.PersistentVolumeClaim
	for _, name := range names {
		claims = append(claims, s.createClaim(testutil.NewPVC(s.ns, name).Class(s.imm)))
	}
	testutil.Eventually(s.t, 0, fmt.Sprintf("CreateVolume of %v not started", names), func(ctx context.Context) (bool, error) {
		ids, err := s.driver.VolumeIDs(ctx)
		return len(ids) == want, err
	})
	for _, c := range claims {
		if _, err := s.c.CoreV1().PersistentVolumes().Get(s.t.Context(), "pvc-"+string(c.UID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			s.t.Fatalf("PV of %s exists (%v) while its CreateVolume should be in flight; the test missed the window", c.Name, err)
		}
	}
	return claims
}

// pendingClaims creates, while no provisioner runs, an Immediate claim and a
// WaitForFirstConsumer claim whose node the scheduler selected, and waits
// until kube-controller-manager's binder has handed both to the driver
// (volume.kubernetes.io/storage-provisioner).
func (s *switchover) pendingClaims() {
	s.t.Helper()
	s.createClaim(testutil.NewPVC(s.ns, "pending-imm").Class(s.imm))
	s.createClaim(testutil.NewPVC(s.ns, "pending-wfc").Class(s.wfc).Annotation(annSelectedNode, s.driver.NodeID))
	for _, name := range []string{"pending-imm", "pending-wfc"} {
		s.waitClaim(name, "handed to the driver", func(c *corev1.PersistentVolumeClaim) bool {
			return c.Annotations[annStorageProv] == s.env.driver && c.Status.Phase == corev1.ClaimPending
		})
	}
}

// releaseClaim deletes a Bound claim while no provisioner runs and waits
// until kube-controller-manager's binder has marked its PV Released. With
// deletePV, the PV itself is then deleted, as an administrator might: it
// stays, being deleted, with the provisioner's finalizer. It returns the
// PV's name.
func (s *switchover) releaseClaim(name string, deletePV bool) string {
	s.t.Helper()
	pv := s.getClaim(name).Spec.VolumeName
	s.deleteClaim(name)
	s.waitPVPhase(pv, corev1.VolumeReleased)
	if deletePV {
		if err := s.c.CoreV1().PersistentVolumes().Delete(s.t.Context(), pv, metav1.DeleteOptions{}); err != nil {
			s.t.Fatal(err)
		}
		s.waitPV(pv, "being deleted with only the provisioner's finalizer", func(v *corev1.PersistentVolume) bool {
			return v.DeletionTimestamp != nil && slices.Equal(v.Finalizers, []string{"external-provisioner.volume.kubernetes.io/finalizer"})
		})
	}
	return pv
}

// settle waits until every claim of the namespace is Bound, no claim
// carries the in-flight finalizer, the driver's volumes are exactly the
// handles of the driver's PVs and each PV is Bound. It returns the claims.
func (s *switchover) settle(n int) []corev1.PersistentVolumeClaim {
	s.t.Helper()
	claims := s.waitAllBound(n)
	testutil.Eventually(s.t, 0, "PVs, driver volumes and claim finalizers did not settle", func(ctx context.Context) (bool, error) {
		handles, others, err := s.driverPVs(ctx)
		if err != nil || len(others) > 0 || len(handles) != n {
			return false, err
		}
		if ids, err := s.driver.VolumeIDs(ctx); err != nil || !slices.Equal(ids, handles) {
			return false, err
		}
		list, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims = list.Items
		return !slices.ContainsFunc(claims, func(c corev1.PersistentVolumeClaim) bool { return inflight.Has(&c) }), nil
	})
	return claims
}

// deleteAll deletes every claim of the namespace and waits until no PV of
// the driver and no driver volume is left.
func (s *switchover) deleteAll() {
	s.t.Helper()
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).DeleteCollection(s.t.Context(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		s.t.Fatal(err)
	}
	testutil.Eventually(s.t, 0, "claims, PVs or driver volumes remain after every claim was deleted", func(ctx context.Context) (bool, error) {
		list, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) > 0 {
			return false, err
		}
		handles, others, err := s.driverPVs(ctx)
		if err != nil || len(handles)+len(others) > 0 {
			return false, err
		}
		ids, err := s.driver.VolumeIDs(ctx)
		return len(ids) == 0, err
	})
}

var deleteLine = regexp.MustCompile(`"(?:Deleted volume|Volume does not exist, nothing to delete)".* volumeID="([^"]+)"`)

// deleteCalls counts, from the driver's log, the DeleteVolume calls that
// got past the secret check, by volume ID.
func (s *switchover) deleteCalls() map[string]int {
	s.t.Helper()
	f, err := os.Open(s.driver.LogPath)
	if err != nil {
		s.t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	calls := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if m := deleteLine.FindStringSubmatch(sc.Text()); m != nil {
			calls[m[1]]++
		}
	}
	if err := sc.Err(); err != nil {
		s.t.Fatal(err)
	}
	return calls
}

// handles returns the volume handles of the claims' PVs.
func (s *switchover) handles(claims []corev1.PersistentVolumeClaim) []string {
	s.t.Helper()
	var out []string
	for i := range claims {
		out = append(out, s.getPV(claims[i].Spec.VolumeName).Spec.CSI.VolumeHandle)
	}
	slices.Sort(out)
	return out
}

// TestSwitchoverFromUpstream replaces upstream external-provisioner (with
// kube-controller-manager's binder) by this sidecar on the same driver, with
// objects in every state upstream leaves: claims Bound to volumes upstream
// provisioned (with its deletion-secret annotations and PV finalizer), a
// claim whose CreateVolume upstream started when it was killed (volume on
// the driver, no PV), Released volumes waiting for their deletion (one
// whose PV an administrator deleted meanwhile), and claims
// handed to the driver but not provisioned yet (Immediate, and
// WaitForFirstConsumer with a selected node). Ours binds every claim, the
// in-flight one to the volume upstream created, deletes the Released
// volumes, and, when every claim is deleted, deletes every volume: each with
// exactly one DeleteVolume, and no volume is left on the driver.
func TestSwitchoverFromUpstream(t *testing.T) {
	s := newSwitchover(t)
	up := s.startUpstream()
	s.boundClaims("bound", s.imm, 3)
	s.boundClaims("released", s.imm, 2)
	inFlight := s.createInFlight(6, "in-flight")[0]
	s.kill(up)
	released := []string{s.releaseClaim("released-0", false), s.releaseClaim("released-1", true)}
	s.pendingClaims()
	before, err := s.driver.VolumeIDs(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	s.startOurs()
	for _, pv := range released {
		s.waitPVGone(pv)
	}
	claims := s.settle(6)
	inFlightPV := s.getClaim(inFlight.Name).Spec.VolumeName
	if !slices.Contains(before, s.getPV(inFlightPV).Spec.CSI.VolumeHandle) {
		t.Errorf("claim %s bound to volume %s, not the one upstream created (driver had %v)", inFlight.Name, inFlightPV, before)
	}
	for i := range claims {
		pv := s.getPV(claims[i].Spec.VolumeName)
		if pv.Annotations[annProvisionedBy] != s.env.driver || pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"] != switchSecret {
			t.Errorf("PV %s of claim %s: annotations %v", pv.Name, claims[i].Name, pv.Annotations)
		}
		if !slices.Contains(pv.Finalizers, "external-provisioner.volume.kubernetes.io/finalizer") {
			t.Errorf("PV %s of claim %s: finalizers %v, want upstream's", pv.Name, claims[i].Name, pv.Finalizers)
		}
	}
	handles := s.handles(claims)

	s.deleteAll()
	calls := s.deleteCalls()
	for _, id := range append(handles, goneHandles(before, handles)...) {
		if calls[id] != 1 {
			t.Errorf("volume %s: %d DeleteVolume calls, want 1", id, calls[id])
		}
	}
}

// goneHandles returns the volumes of before that are not in handles
// (those deleted before the claims were: the Released volumes, the volume
// of a claim deleted meanwhile).
func goneHandles(before, handles []string) []string {
	var out []string
	for _, id := range before {
		if !slices.Contains(handles, id) {
			out = append(out, id)
		}
	}
	return out
}

// TestRollbackToUpstream replaces this sidecar by upstream
// external-provisioner (with kube-controller-manager's binder) on the same
// driver, with objects in every state ours leaves: claims Bound to volumes
// ours provisioned and bound, a claim whose CreateVolume ours started when
// it was killed (volume on the driver, no PV, the in-flight finalizer on the
// claim; a second such claim deleted meanwhile), Released volumes (one
// whose PV an administrator deleted), and claims handed to the driver but
// not provisioned. Upstream binds every claim, the in-flight ones to the
// volumes ours created, but cannot remove our in-flight finalizer; after
// the step the README's rollback notes give for it, the deleted claim goes,
// deleting every claim deletes every volume, and none is left.
func TestRollbackToUpstream(t *testing.T) {
	s := newSwitchover(t)
	ours := s.startOurs()
	s.boundClaims("bound", s.imm, 3)
	s.boundClaims("released", s.imm, 2)
	started := s.createInFlight(7, "in-flight", "in-flight-deleted")
	for _, c := range started {
		if !inflight.Has(s.getClaim(c.Name)) {
			t.Fatalf("claim %s has no in-flight finalizer while its CreateVolume runs", c.Name)
		}
	}
	inFlight := started[0]
	s.kill(ours)
	// Deleted while ours was down: the in-flight finalizer keeps the claim.
	s.deleteClaim("in-flight-deleted")
	released := []string{s.releaseClaim("released-0", false), s.releaseClaim("released-1", true)}
	s.pendingClaims()
	before, err := s.driver.VolumeIDs(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	s.startUpstream()
	for _, pv := range released {
		s.waitPVGone(pv)
	}
	// Upstream provisions the claim being deleted too (it does not check),
	// and kube-controller-manager binds it: the in-flight finalizer still
	// holds it.
	claims := s.waitAllBound(7)
	inFlightPV := s.getClaim(inFlight.Name).Spec.VolumeName
	if !slices.Contains(before, s.getPV(inFlightPV).Spec.CSI.VolumeHandle) {
		t.Errorf("claim %s bound to volume %s, not the one ours created (driver had %v)", inFlight.Name, inFlightPV, before)
	}
	gonePV := s.getClaim("in-flight-deleted").Spec.VolumeName
	removeInflightFinalizers(t, s.env)
	testutil.Eventually(t, 0, "claim in-flight-deleted not gone", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, "in-flight-deleted", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	s.waitPVGone(gonePV)
	claims = s.settle(len(claims) - 1)
	handles := s.handles(claims)

	s.deleteAll()
	calls := s.deleteCalls()
	for _, id := range append(handles, goneHandles(before, handles)...) {
		switch n := calls[id]; {
		case n == 0:
			t.Errorf("volume %s: no DeleteVolume", id)
		case n > 1:
			// Upstream's own duplicate deletion (external-provisioner
			// issue #1235), not a rollback defect.
			t.Logf("volume %s: %d DeleteVolume calls from upstream", id, n)
		}
	}
}

// removeInflightFinalizers does what the README's rollback notes say: once
// a claim is Bound to a volume the driver provisioned for it (the PV names
// the claim's UID and is provisioned by the driver), the in-flight
// finalizer that ours left on it is removed.
func removeInflightFinalizers(t *testing.T, e *env) {
	t.Helper()
	list, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		c := list.Items[i].DeepCopy()
		if c.Status.Phase != corev1.ClaimBound || !inflight.Has(c) {
			continue
		}
		pv, err := e.c.CoreV1().PersistentVolumes().Get(t.Context(), c.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != c.UID || pv.Annotations[annProvisionedBy] != e.driver {
			t.Logf("claim %s keeps the in-flight finalizer: volume %s was not provisioned for it (%v)", c.Name, c.Spec.VolumeName, err)
			continue
		}
		inflight.Remove(c)
		t.Logf("claim %s: in-flight finalizer removed after the rollback (finalizers left: %s)", c.Name, strings.Join(c.Finalizers, ","))
		// A claim being deleted may be gone as the update lands.
		if _, err := e.c.CoreV1().PersistentVolumeClaims(e.ns).Update(t.Context(), c, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}
