package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

const annSelectedNode = "volume.kubernetes.io/selected-node"

// TestWaitForFirstConsumerReschedule: with --strict-topology, a claim whose
// selected node cannot hold its volume goes back to the scheduler, as
// upstream's does: the sidecar removes the selected-node annotation and
// posts a Warning ProvisioningFailed saying why, without a volume in the
// driver. Two causes: the selected node does not exist (deleted after the
// scheduler chose it), and the driver answers RESOURCE_EXHAUSTED for the
// node's topology (the example driver serves only its own node). A node the
// driver serves then gets the volume.
func TestWaitForFirstConsumerReschedule(t *testing.T) {
	s := newStack(t, stackConfig{topology: true, sidecarArgs: []string{"--strict-topology"}})
	ctx := t.Context()
	if err := s.driver.RegisterNode(ctx, s.c); err != nil {
		t.Fatal(err)
	}
	other := s.ns + "-other"
	s.node(s.driver.Name, other)
	sc := s.class("wffc", waitForFirstConsumer)
	claim := s.claim(testutil.NewPVC(s.ns, "moved").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), "Normal", "WaitForFirstConsumer", "waiting for first consumer")

	for _, step := range []struct{ node, fragment string }{
		{s.ns + "-gone", `node "` + s.ns + `-gone" not found`},
		{other, "cannot provision in the requisite topology"},
	} {
		s.selectNode(claim.Name, step.node)
		s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed", step.fragment)
		testutil.Eventually(t, 0, "selected node "+step.node+" not removed from the claim", func(ctx context.Context) (bool, error) {
			got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if got.Spec.VolumeName != "" {
				t.Fatalf("claim bound to %s with node %s selected", got.Spec.VolumeName, step.node)
			}
			// Nothing is in flight after the answer: the in-flight
			// finalizer goes with the selected node, so that the claim
			// can be deleted even after the sidecar restarts.
			_, ok := got.Annotations[annSelectedNode]
			return !ok && !inflight.Has(got), nil
		})
		if vols, err := s.driver.ListVolumes(ctx); err != nil || len(vols) != 0 {
			t.Fatalf("driver volumes after selecting %s: %v, %v; want none", step.node, vols, err)
		}
	}

	s.selectNode(claim.Name, s.driver.NodeID)
	_, pv := s.waitBound(claim.Name)
	s.checkOnDriverNode(pv)
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestDeletedWithoutNodeAfterRestart: the sidecar is killed while the
// CreateVolume of a late-binding claim is in flight, and the selected node
// is deleted before it restarts. The restarted sidecar sends the claim back
// to the scheduler (the node is gone), but cannot know whether the killed
// one's create made a volume, so the in-flight finalizer stays. When the
// claim is then deleted, no CreateVolume can be sent to find out (no node
// is selected), and a Warning says what to check instead of the claim
// staying Terminating in silence.
func TestDeletedWithoutNodeAfterRestart(t *testing.T) {
	const node = "node-deleted-during-restart"
	s := newStack(t, stackConfig{
		topology: true, nodeID: node,
		driverArgs:  []string{"--create-latency=4s"},
		sidecarArgs: []string{"--strict-topology", "--timeout=30s"},
	})
	ctx := t.Context()
	if err := s.driver.RegisterNode(ctx, s.c); err != nil {
		t.Fatal(err)
	}
	removeNode := func(ctx context.Context) {
		_ = s.c.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
		_ = s.c.StorageV1().CSINodes().Delete(ctx, node, metav1.DeleteOptions{})
	}
	t.Cleanup(func() { removeNode(context.Background()) })
	sc := s.class("wffc", waitForFirstConsumer)
	claim := s.claim(testutil.NewPVC(s.ns, "orphan").Class(sc.Name))
	s.selectNode(claim.Name, node)
	s.waitCreateVolumeStarted(claim)
	s.kill()
	removeNode(ctx)
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "claim not sent back to the scheduler", func(ctx context.Context) (bool, error) {
		got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{})
		_, selected := got.Annotations[annSelectedNode]
		return err == nil && !selected, err
	})
	if got := s.getClaim(claim.Name); !inflight.Has(got) {
		t.Fatalf("finalizers %v: the in-flight finalizer went although the killed sidecar's create may have made a volume", got.Finalizers)
	}

	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed",
		"being deleted without a selected node, and a CreateVolume for it may have been in progress before this provisioner started; finalizer "+
			inflight.Finalizer+" stays so that a volume named pvc-"+string(claim.UID)+" cannot leak")
	vols, err := s.driver.ListVolumes(ctx)
	if err != nil || len(vols) != 1 || vols[0].GetVolumeId() == "" {
		t.Fatalf("driver volumes = %v, %v; want the one the killed sidecar's create made", vols, err)
	}

	// Follow the Warning.
	if err := s.driver.DeleteVolume(ctx, vols[0].GetVolumeId()); err != nil {
		t.Fatal(err)
	}
	s.updateClaim(claim.Name, func(c *corev1.PersistentVolumeClaim) { inflight.Remove(c) })
	s.waitGone(claim.Name, "")
}

// selectNode plays the scheduler: it sets the claim's selected-node
// annotation.
func (s *stack) selectNode(claim, node string) {
	s.t.Helper()
	s.updateClaim(claim, func(c *corev1.PersistentVolumeClaim) {
		metav1.SetMetaDataAnnotation(&c.ObjectMeta, annSelectedNode, node)
	})
}

// node creates a Node and a CSINode named name on which driver is
// registered with the topology segment TopologyKey=name, as a kubelet with
// the driver's node plugin would (for the example driver, which serves only
// its own node, a node it cannot provision for). Both are deleted at the
// end of the test.
func (s *stack) node(driver, name string) {
	s.t.Helper()
	ctx := s.t.Context()
	if _, err := s.c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{e2e.TopologyKey: name, corev1.LabelHostname: name},
	}}, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		_ = s.c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if _, err := s.c.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
			{Name: driver, NodeID: name, TopologyKeys: []string{e2e.TopologyKey}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		_ = s.c.StorageV1().CSINodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestRescheduleWithControllerManagerBinder: with the sidecar's binder off
// (upstream's deployment), the provisioner adds the in-flight finalizer
// itself before CreateVolume. A claim whose selected node is out of room
// (RESOURCE_EXHAUSTED) then goes back to the scheduler after that one
// CreateVolume, with one Warning and one failure counted, as upstream: the
// library's write that removes selected-node comes from its copy of the
// claim without the finalizer, and must not fail with a conflict and make
// the library call CreateVolume again.
func TestRescheduleWithControllerManagerBinder(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{
		controlPlane: cp, memory: true, topology: true, driverArgs: []string{"--capacity=10Gi"},
		sidecarArgs: []string{"--http-endpoint=" + endpoint, "--enable-binder=false"},
	})
	ctx := t.Context()
	if err := s.driver.RegisterNode(ctx, s.c); err != nil {
		t.Fatal(err)
	}
	sc := s.class("wffc", waitForFirstConsumer)
	claim := s.claim(testutil.NewPVC(s.ns, "big").Class(sc.Name).Size("20Gi").Annotation(annSelectedNode, s.driver.NodeID))
	testutil.Eventually(t, 0, "selected node not removed from the claim", func(ctx context.Context) (bool, error) {
		got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, ok := got.Annotations[annSelectedNode]
		return !ok && !inflight.Has(got), nil
	})
	_, body, err := httpGet(ctx, endpoint, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`csi_sidecar_operations_seconds_count{driver_name="` + s.driver.Name + `",grpc_status_code="ResourceExhausted",method_name="/csi.v1.Controller/CreateVolume"} 1` + "\n",
		`controller_persistentvolumeclaim_provision_failed_total{class="` + sc.Name + `",source=""} 1` + "\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", strings.TrimSpace(want))
		}
	}
	for line := range strings.Lines(body) {
		if strings.Contains(line, "CreateVolume") && strings.HasPrefix(line, "csi_sidecar_operations_seconds_count") {
			t.Logf("%s", strings.TrimSpace(line))
		}
	}
}
