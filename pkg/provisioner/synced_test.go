package provisioner

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestSyncedVersions follows one claim's update notifications after the
// library decided to provision version 5 of it: which ones the library's
// handlers would not get, and when the record goes.
func TestSyncedVersions(t *testing.T) {
	at := func(rv string) *corev1.PersistentVolumeClaim { return newClaim("c").RV(rv).Obj() }
	type update struct {
		old, cur string
		skipped  bool
	}
	tests := []struct {
		name    string
		updates []update
		// deleted forgets the claim before the updates.
		deleted bool
	}{
		{name: "the synced version's notification after an older one", updates: []update{{"3", "4", false}, {"4", "5", true}}},
		{name: "a newer version drops the record", updates: []update{{"5", "6", false}, {"4", "5", false}}},
		{name: "resyncs pass", updates: []update{{"5", "5", false}, {"4", "5", true}}},
		{name: "versions that are not integers are not older", updates: []update{{"4", "x", false}, {"4", "5", false}}},
		{name: "a deleted claim is forgotten", deleted: true, updates: []update{{"4", "5", false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSyncedVersions()
			s.record(at("5"))
			if tt.deleted {
				s.forget(at("5").UID)
			}
			for _, u := range tt.updates {
				if got := s.alreadySynced(at(u.old), at(u.cur)); got != u.skipped {
					t.Errorf("update %s → %s skipped = %v, want %v", u.old, u.cur, got, u.skipped)
				}
			}
		})
	}
}
