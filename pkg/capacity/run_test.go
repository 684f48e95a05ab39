package capacity

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// runController runs a controller with started informers over a fake API
// server holding objs, until the test ends.
func runController(t *testing.T, objs []runtime.Object, driver *fakeDriver, opts ...Option) (*Controller, *fake.Clientset) {
	t.Helper()
	c, client, factory := newController(t, objs, driver, opts...)
	ctx, cancel := context.WithCancel(testContext(t))
	factory.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, 2)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		factory.Shutdown()
	})
	return c, client
}

// published returns "class/segment=capacity" of every object in the fake API
// server, sorted.
func published(ctx context.Context, t *testing.T, client *fake.Clientset) []string {
	list, err := client.StorageV1().CSIStorageCapacities(testNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var out []string
	for _, o := range list.Items {
		out = append(out, fmt.Sprintf("%s/%s=%s", o.StorageClassName, segment(o.NodeTopology.MatchLabels), o.Capacity))
	}
	slices.Sort(out)
	return out
}

func waitPublished(t *testing.T, client *fake.Clientset, msg string, want ...string) {
	t.Helper()
	var got []string
	testutil.Eventually(t, 0, msg, func(ctx context.Context) (bool, error) {
		got = published(ctx, t, client)
		return slices.Equal(got, want), nil
	})
}

func TestRunPoll(t *testing.T) {
	objs := objects(one(wffc("fast")), zoneNode("n1", "a"), zoneNode("n2", "b"), one(csc("stale", "gone", "a", 1)))
	driver := &fakeDriver{available: gi(10)}
	registry := metrics.NewKubeRegistry()
	c, client := runController(t, objs, driver,
		WithPollInterval(50*time.Millisecond), WithRetry(10*time.Millisecond, 50*time.Millisecond), WithMetricsRegistry(registry))
	ka, kb := fmt.Sprintf("fast/%s=10Gi", zone("a")), fmt.Sprintf("fast/%s=10Gi", zone("b"))
	waitPublished(t, client, "initial objects, stale one deleted", ka, kb)
	if !c.HasSynced() {
		t.Error("HasSynced: false after the first objects were published")
	}

	driver.set(gi(20), nil)
	waitPublished(t, client, "capacity refreshed by polling",
		fmt.Sprintf("fast/%s=20Gi", zone("a")), fmt.Sprintf("fast/%s=20Gi", zone("b")))

	// GetCapacity fails: the objects stay as they are, and recover.
	driver.set(gi(30), fmt.Errorf("driver unavailable"))
	n := len(driver.calls())
	testutil.Eventually(t, 0, "failing GetCapacity retried", func(context.Context) (bool, error) {
		return len(driver.calls()) > n+4, nil
	})
	if got, want := published(t.Context(), t, client), []string{fmt.Sprintf("fast/%s=20Gi", zone("a")), fmt.Sprintf("fast/%s=20Gi", zone("b"))}; !slices.Equal(got, want) {
		t.Fatalf("after GetCapacity errors: published %q, want %q", got, want)
	}
	driver.set(gi(30), nil)
	waitPublished(t, client, "recovered after GetCapacity errors",
		fmt.Sprintf("fast/%s=30Gi", zone("a")), fmt.Sprintf("fast/%s=30Gi", zone("b")))

	if err := client.StorageV1().StorageClasses().Delete(t.Context(), "fast", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete class: %v", err)
	}
	waitPublished(t, client, "objects of a deleted class removed")
	testutil.Eventually(t, 0, "gauges at zero", func(context.Context) (bool, error) {
		return maps.Equal(gauges(t, registry), want(0, 0, 0)), nil
	})
}

func TestRunEvents(t *testing.T) {
	objs := objects(one(wffc("fast")), zoneNode("n1", "a"), zoneNode("n2", "b"))
	driver := &fakeDriver{available: gi(10)}
	// No polling during the test: everything below is driven by events.
	_, client := runController(t, objs, driver, WithPollInterval(time.Hour), WithRetry(10*time.Millisecond, 50*time.Millisecond))
	ctx := t.Context()
	waitPublished(t, client, "initial objects", fmt.Sprintf("fast/%s=10Gi", zone("a")), fmt.Sprintf("fast/%s=10Gi", zone("b")))

	// A volume provisioned in zone a refreshes zone a only.
	driver.set(gi(9), nil)
	pv := testutil.NewPV("pv-1", testDriver).Class("fast").NodeAffinity(zoneKey, "a").Obj()
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pv: %v", err)
	}
	waitPublished(t, client, "zone a refreshed after provisioning", fmt.Sprintf("fast/%s=9Gi", zone("a")), fmt.Sprintf("fast/%s=10Gi", zone("b")))

	// A new zone gets its object.
	node, csiNode := zoneNode("n3", "c")[0].(*corev1.Node), zoneNode("n3", "c")[1].(*storagev1.CSINode)
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	if _, err := client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSINode: %v", err)
	}
	waitPublished(t, client, "object for the new zone",
		fmt.Sprintf("fast/%s=9Gi", zone("a")), fmt.Sprintf("fast/%s=10Gi", zone("b")), fmt.Sprintf("fast/%s=9Gi", zone("c")))

	// An object deleted by someone else is created again.
	list, err := client.StorageV1().CSIStorageCapacities(testNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	for _, o := range list.Items {
		if o.NodeTopology.MatchLabels[zoneKey] == "b" {
			if err := client.StorageV1().CSIStorageCapacities(testNamespace).Delete(ctx, o.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("delete: %v", err)
			}
		}
	}
	waitPublished(t, client, "deleted object created again",
		fmt.Sprintf("fast/%s=9Gi", zone("a")), fmt.Sprintf("fast/%s=9Gi", zone("b")), fmt.Sprintf("fast/%s=9Gi", zone("c")))
}

// TestRunClaimRescheduled checks that a claim of a class handed back to the
// scheduler (its selected-node annotation removed, as the provisioning
// library does when CreateVolume answered RESOURCE_EXHAUSTED on that node)
// refreshes the objects of its class at once, as upstream's provision
// wrapper does after a failed provisioning: otherwise the scheduler keeps
// picking the node whose stale object promises room until the next poll.
func TestRunClaimRescheduled(t *testing.T) {
	const selectedNode = "volume.kubernetes.io/selected-node"
	claim := testutil.NewPVC("ns", "c").Class("fast").Annotation(selectedNode, "n1").Obj()
	objs := objects(one(wffc("fast")), one(wffc("other")), zoneNode("n1", "a"), zoneNode("n2", "b"), one(claim))
	driver := &fakeDriver{available: gi(10)}
	_, client := runController(t, objs, driver, WithPollInterval(time.Hour), WithRetry(10*time.Millisecond, 50*time.Millisecond))
	ctx := t.Context()
	waitPublished(t, client, "initial objects",
		fmt.Sprintf("fast/%s=10Gi", zone("a")), fmt.Sprintf("fast/%s=10Gi", zone("b")),
		fmt.Sprintf("other/%s=10Gi", zone("a")), fmt.Sprintf("other/%s=10Gi", zone("b")))

	// Out-of-band use filled the storage; the driver refuses the volume.
	driver.set(gi(1), nil)
	rescheduled := claim.DeepCopy()
	delete(rescheduled.Annotations, selectedNode)
	if _, err := client.CoreV1().PersistentVolumeClaims("ns").Update(ctx, rescheduled, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update claim: %v", err)
	}
	waitPublished(t, client, "the rescheduled claim's class refreshed",
		fmt.Sprintf("fast/%s=1Gi", zone("a")), fmt.Sprintf("fast/%s=1Gi", zone("b")),
		fmt.Sprintf("other/%s=10Gi", zone("a")), fmt.Sprintf("other/%s=10Gi", zone("b")))
}

// TestRunNodeDeployment runs a node's controller in node deployment: it
// publishes its own segment only (not the other nodes' CSINodes), labels
// its object with its node, and leaves another node's object alone.
func TestRunNodeDeployment(t *testing.T) {
	other := csc("csisc-n2", "fast", "b", gi(5), func(o *storagev1.CSIStorageCapacity) {
		o.Labels[managedByLabel] = managedByValue("n2")
	})
	objs := objects(one(wffc("fast")), zoneNode("n1", "a"), zoneNode("n2", "b"), one(other))
	driver := &fakeDriver{available: gi(10)}
	_, client := runController(t, objs, driver, WithNodeDeployment("n1", zone("a")), WithPollInterval(time.Hour))
	waitPublished(t, client, "this node's object next to the other node's",
		fmt.Sprintf("fast/%s=10Gi", zone("a")), fmt.Sprintf("fast/%s=5Gi", zone("b")))
	list, err := client.StorageV1().CSIStorageCapacities(testNamespace).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range list.Items {
		want := "external-provisioner-n1"
		if o.Name == other.Name {
			want = "external-provisioner-n2"
		}
		if got := o.Labels[managedByLabel]; got != want {
			t.Errorf("object %s for %v: managed-by %q, want %q", o.Name, o.NodeTopology.MatchLabels, got, want)
		}
	}
	for _, req := range driver.calls() {
		if !maps.Equal(req.GetAccessibleTopology().GetSegments(), zone("a")) {
			t.Errorf("GetCapacity for %v: a node asks for its own segment only", req.GetAccessibleTopology().GetSegments())
		}
	}
}

func TestManagedByValue(t *testing.T) {
	long := strings.Repeat("n", 70)
	tests := []struct {
		node, want string
	}{
		{node: "", want: "external-provisioner"},
		{node: "worker-1", want: "external-provisioner-worker-1"},
		// Upstream v6.3.0's values for the same node names.
		{node: "ip-10-0-12-34.eu-central-1.compute.internal", want: "external-p-53f40b57-ip-10-0-12-34.eu-central-1.compute.internal"},
		{node: "n2345678901234567890123456789012345678901234567890123", want: "external-provisioner-ad0ed270"},
		{node: "a-very-long-node-name-that-is-longer-than-fifty-two-characters.example.com", want: "external-provisioner-cf8833b9"},
	}
	for _, tt := range tests {
		if got := managedByValue(tt.node); got != tt.want {
			t.Errorf("managedByValue(%q) = %q, want %q", tt.node, got, tt.want)
		}
	}
	a, b := managedByValue(long+"-a"), managedByValue(long+"-b")
	for _, v := range []string{a, b} {
		if errs := validation.IsValidLabelValue(v); len(errs) != 0 {
			t.Errorf("managedByValue of a long node name = %q: %v", v, errs)
		}
	}
	if a == b {
		t.Errorf("two long node names with the same start share the label %q", a)
	}
}
