package capacity

import (
	"fmt"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
)

// TestUpdatedAndDeletedBeforeRecorded: an object deleted (by a user, the
// garbage collector, another worker) right after the controller updated it,
// the informer delivering the update and the deletion before Update
// returns, must be created again at the next sync: recorded after its
// deletion, it would stand for an object the cache will never deliver, and
// every poll would find the capacity written while no object exists.
func TestUpdatedAndDeletedBeforeRecorded(t *testing.T) {
	driver := &fakeDriver{available: gi(10)}
	cached := csc("a", "fast", "a", gi(10))
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a"), one(cached)), driver)
	ctx := testContext(t)
	key := itemKey("fast", zone("a"))
	h.client.PrependReactor("update", "csistoragecapacities", func(action clienttesting.Action) (bool, runtime.Object, error) {
		obj := action.(clienttesting.UpdateAction).GetObject().(*storagev1.CSIStorageCapacity).DeepCopy()
		obj.ResourceVersion = "2"
		// What the informer delivers meanwhile: the update, then the
		// deletion.
		h.cache(t, obj)
		h.c.onObject(obj)
		if err := h.c.objInformer.GetStore().Delete(obj); err != nil {
			t.Fatal(err)
		}
		h.c.onObjectDelete(obj)
		if err := h.client.Tracker().Delete(action.GetResource(), obj.Namespace, obj.Name); err != nil {
			t.Fatal(err)
		}
		return true, obj, nil
	})

	driver.set(gi(9), nil)
	_ = h.c.syncItem(ctx, key) // the update, whose object is then gone
	h.drain()
	// The poll: the capacity is still 9Gi.
	for i := range 3 {
		if err := h.c.syncItem(ctx, key); err != nil {
			t.Logf("sync %d: %v", i, err)
		}
	}
	list, err := h.client.StorageV1().CSIStorageCapacities(testNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		rec := "none"
		if r := h.c.written[key]; r != nil {
			rec = fmt.Sprintf("%s (resourceVersion %s)", r.Name, r.ResourceVersion)
		}
		t.Errorf("%d objects for the item after three syncs, want 1 (created again); the controller's record: %s", len(list.Items), rec)
	}
}

// TestCreatedAndDeletedUnseen: an object created and then deleted while the
// CSIStorageCapacity watch was broken (the relist shows neither) is created
// again at a later poll: a record the informer has not delivered for a
// whole poll interval is dropped.
func TestCreatedAndDeletedUnseen(t *testing.T) {
	driver := &fakeDriver{available: gi(10)}
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a")), driver)
	ctx := testContext(t)
	key := itemKey("fast", zone("a"))
	if err := h.c.syncItem(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := h.client.StorageV1().CSIStorageCapacities(testNamespace).Delete(ctx, "csisc-gen1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 3 { // polls
		h.c.queueAll()
		h.drain()
		if err := h.c.syncItem(ctx, key); err != nil {
			t.Log(err)
		}
	}
	list, err := h.client.StorageV1().CSIStorageCapacities(testNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Errorf("%d objects after three polls, want 1", len(list.Items))
	}
}
