package main

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func benchPV(name, class, claim string) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "7", Annotations: map[string]string{"a": "b"}}}
	pv.Spec.StorageClassName = class
	if claim != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: benchNS, Name: claim, UID: "u"}
	}
	return pv
}

// TestDeletions: only the benchmark's PVs are followed; a PV's deletion
// (also as a tombstone) is timed against its claim's Delete call.
func TestDeletions(t *testing.T) {
	d := newDeletions(3)
	d.add(benchPV("pv-0", benchClass, "claim-000000"))
	d.add(benchPV("pv-1", benchClass, "claim-000001"))
	d.add(benchPV("pv-x", "other", "claim-000002"))         // another class
	d.add(benchPV("pv-y", benchClass, "claim-000009"))      // index out of range
	d.add(benchPV("pv-z", benchClass, ""))                  // no claim
	d.add(benchPV("pv-w", benchClass, "not-a-bench-claim")) // not ours
	if got := d.remaining(); got != 2 {
		t.Fatalf("remaining = %d, want 2", got)
	}
	start := time.Now()
	d.deleted[0], d.deleted[1] = start, start
	d.remove(benchPV("pv-0", benchClass, "claim-000000"))
	d.remove(cache.DeletedFinalStateUnknown{Key: "pv-1", Obj: benchPV("pv-1", benchClass, "claim-000001")})
	d.remove(benchPV("pv-x", "other", "claim-000002"))
	if got := d.remaining(); got != 0 {
		t.Errorf("remaining after the deletes = %d, want 0", got)
	}
	if lat := d.latencies(); len(lat) != 2 || lat[0] < 0 {
		t.Errorf("latencies = %v, want two non-negative", lat)
	}
	select {
	case <-d.changed:
	default:
		t.Error("no change signalled")
	}
}

func TestKeepDeletionFields(t *testing.T) {
	obj, err := keepDeletionFields(benchPV("pv-0", benchClass, "claim-000000"))
	if err != nil {
		t.Fatal(err)
	}
	pv := obj.(*corev1.PersistentVolume)
	if pv.Name != "pv-0" || pv.Spec.StorageClassName != benchClass || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != "claim-000000" || pv.Spec.ClaimRef.Namespace != benchNS {
		t.Errorf("kept %+v, want name, class and claimRef", pv)
	}
	if pv.Annotations != nil || pv.Spec.ClaimRef.UID != "" {
		t.Errorf("kept more than needed: annotations %v, claimRef UID %q", pv.Annotations, pv.Spec.ClaimRef.UID)
	}
	if other, _ := keepDeletionFields("not a PV"); other != "not a PV" {
		t.Errorf("a non-PV was changed: %v", other)
	}
}
