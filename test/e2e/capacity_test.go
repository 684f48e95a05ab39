package e2e

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestCapacity runs the sidecar with --enable-capacity against the hostpath
// driver (10Gi in all, topology on) and checks the CSIStorageCapacity
// objects it publishes: one per topology segment and WaitForFirstConsumer
// class of the driver, none for an Immediate class, owned by the Deployment
// two owners above the pod, a zero for a node the driver cannot serve,
// refreshed when a volume is provisioned and deleted (the poll interval is an
// hour, so only the PV events can do it), and deleted with their class.
func TestCapacity(t *testing.T) {
	const podName = "csi-controller-0"
	var deploy *appsv1.Deployment
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{
		memory: true, topology: true,
		driverArgs:  []string{"--capacity=10Gi"},
		sidecarArgs: []string{"--enable-capacity", "--capacity-ownerref-level=2", "--capacity-poll-interval=1h", "--http-endpoint=" + endpoint},
		sidecarEnv:  func(s *stack) []string { return []string{"POD_NAME=" + podName, "NAMESPACE=" + s.ns} },
		beforeSidecar: func(s *stack) {
			if err := s.driver.RegisterNode(t.Context(), s.c); err != nil {
				t.Fatal(err)
			}
			var err error
			if deploy, err = e2e.CreateOwnerChain(t.Context(), s.c, s.ns, podName); err != nil {
				t.Fatal(err)
			}
		},
	})
	ctx := t.Context()
	wffc := s.class("wffc", func(sc *storagev1.StorageClass) {
		sc.VolumeBindingMode = ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)
		sc.Parameters = map[string]string{"tier": "gold"}
	})
	s.class("immediate", nil)
	node1 := map[string]string{e2e.TopologyKey: s.driver.NodeID}

	total := resource.MustParse("10Gi")
	s.waitCapacities("one object for the WFFC class on node-1, with all 10Gi", func(got []storagev1.CSIStorageCapacity) error {
		if len(got) != 1 {
			return fmt.Errorf("%d objects", len(got))
		}
		c := got[0]
		if err := checkCapacity(c, wffc.Name, node1, total); err != nil {
			return err
		}
		if c.Labels["csi.storage.k8s.io/drivername"] != s.driver.Name || c.Labels["csi.storage.k8s.io/managed-by"] != "external-provisioner" {
			return fmt.Errorf("labels %v", c.Labels)
		}
		if !strings.HasPrefix(c.Name, "csisc-") {
			return fmt.Errorf("name %s, want generated from csisc-", c.Name)
		}
		if len(c.OwnerReferences) != 1 || c.OwnerReferences[0].UID != deploy.UID || c.OwnerReferences[0].Kind != "Deployment" ||
			c.OwnerReferences[0].Controller == nil || !*c.OwnerReferences[0].Controller {
			return fmt.Errorf("owner references %+v, want the Deployment %s", c.OwnerReferences, deploy.UID)
		}
		return nil
	})

	waitMetrics(t, endpoint, []string{
		"csistoragecapacities_desired_goal 1", "csistoragecapacities_desired_current 1", "csistoragecapacities_obsolete 0",
		`workqueue_adds_total{name="csistoragecapacity"}`,
	})

	// A second node with the driver: the driver serves only its own node,
	// so the new segment's capacity is zero, and it is published.
	node2 := s.ns + "-node-2"
	s.node(s.driver.Name, node2)
	zero := resource.MustParse("0")
	seg2 := map[string]string{e2e.TopologyKey: node2}
	s.waitCapacities("a second object, zero, for the second node", func(got []storagev1.CSIStorageCapacity) error {
		if len(got) != 2 {
			return fmt.Errorf("%d objects", len(got))
		}
		for _, c := range got {
			if maps.Equal(c.NodeTopology.MatchLabels, seg2) {
				return checkCapacity(c, wffc.Name, seg2, zero)
			}
		}
		return fmt.Errorf("none for %v", seg2)
	})

	// Provisioning on node-1 takes 1Gi; the PV event refreshes the object.
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(wffc.Name).Size("1Gi").
		Annotation("volume.kubernetes.io/selected-node", s.driver.NodeID))
	_, pv := s.waitBound(claim.Name)
	left := resource.MustParse("9Gi")
	s.waitCapacities("9Gi left on node-1 after a 1Gi volume", nodeCapacity(wffc.Name, node1, left))
	s.deleteAndWaitGone(claim.Name, pv.Name)
	s.waitCapacities("10Gi again after the deletion", nodeCapacity(wffc.Name, node1, total))

	// Without the class, its objects go.
	if err := s.c.StorageV1().StorageClasses().Delete(ctx, wffc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitCapacities("no object once the class is deleted", func(got []storagev1.CSIStorageCapacity) error {
		if len(got) != 0 {
			return fmt.Errorf("%d objects", len(got))
		}
		return nil
	})
}

// nodeCapacity checks the object of class and segment among all.
func nodeCapacity(class string, segment map[string]string, want resource.Quantity) func([]storagev1.CSIStorageCapacity) error {
	return func(got []storagev1.CSIStorageCapacity) error {
		for _, c := range got {
			if c.StorageClassName == class && maps.Equal(c.NodeTopology.MatchLabels, segment) {
				return checkCapacity(c, class, segment, want)
			}
		}
		return fmt.Errorf("no object for %s in %v", class, segment)
	}
}

func checkCapacity(c storagev1.CSIStorageCapacity, class string, segment map[string]string, want resource.Quantity) error {
	if c.StorageClassName != class || c.NodeTopology == nil || !maps.Equal(c.NodeTopology.MatchLabels, segment) || len(c.NodeTopology.MatchExpressions) != 0 {
		return fmt.Errorf("object %s: class %s, topology %v", c.Name, c.StorageClassName, c.NodeTopology)
	}
	if c.Capacity == nil || c.Capacity.Cmp(want) != 0 {
		return fmt.Errorf("object %s: capacity %v, want %s", c.Name, c.Capacity, want.String())
	}
	return nil
}

// waitCapacities waits until the stack's CSIStorageCapacity objects pass check.
func (s *stack) waitCapacities(what string, check func([]storagev1.CSIStorageCapacity) error) {
	s.t.Helper()
	var last error
	testutil.Eventually(s.t, 0, what, func(ctx context.Context) (bool, error) {
		list, err := s.c.StorageV1().CSIStorageCapacities(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		last = check(list.Items)
		return last == nil, nil
	})
	if last != nil {
		s.t.Logf("last check: %v", last)
	}
}
