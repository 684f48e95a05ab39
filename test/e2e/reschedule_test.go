package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
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
	s.node(other)
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
			_, ok := got.Annotations[annSelectedNode]
			return !ok, nil
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

// selectNode plays the scheduler: it sets the claim's selected-node
// annotation.
func (s *stack) selectNode(claim, node string) {
	s.t.Helper()
	s.updateClaim(claim, func(c *corev1.PersistentVolumeClaim) {
		metav1.SetMetaDataAnnotation(&c.ObjectMeta, annSelectedNode, node)
	})
}

// node creates a Node and a CSINode named name on which the stack's driver
// is registered with the topology segment TopologyKey=name, a node the
// example driver (which serves only its own node) cannot provision for.
// Both are deleted at the end of the test.
func (s *stack) node(name string) {
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
			{Name: s.driver.Name, NodeID: name, TopologyKeys: []string{e2e.TopologyKey}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		_ = s.c.StorageV1().CSINodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}
