package binder

import (
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestNeedsWorkIsCompleteExtended is TestNeedsWorkIsComplete over states
// it does not generate: claims and volumes being deleted, claims without a
// class, an hour later (event renewals), and in-tree migration (static
// in-tree volumes). A sync that writes or posts anything must be one the
// resync queues.
func TestNeedsWorkIsCompleteExtended(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	fails := map[string]int{}
	for i := range 3000 {
		state, desc := genState(r)
		inTree := r.IntN(3) == 0
		for j, o := range state {
			switch x := o.(type) {
			case *corev1.PersistentVolumeClaim:
				x = x.DeepCopy()
				if r.IntN(4) == 0 {
					ts := metav1.NewTime(now)
					x.DeletionTimestamp = &ts
					desc += " claimDeleting"
				}
				if r.IntN(6) == 0 {
					x.Spec.StorageClassName = nil
					desc += " nilClass"
				}
				state[j] = x
			case *corev1.PersistentVolume:
				x = x.DeepCopy()
				if r.IntN(5) == 0 {
					ts := metav1.NewTime(now)
					x.DeletionTimestamp = &ts
					desc += " pvDeleting"
				}
				if inTree && r.IntN(2) == 0 {
					x.Spec.CSI = nil
					x.Spec.AWSElasticBlockStore = &corev1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1"}
					delete(x.Annotations, annProvisionedBy)
					desc += " ebs"
				}
				state[j] = x
			}
		}
		var opts []Option
		if inTree {
			opts = append(opts, WithInTreeMigration(inTreeEBS))
		}
		for _, what := range []string{"pvc/c1", "pv/pv1", "pv/pv2"} {
			f := newFixture(t, append([]runtime.Object(nil), state...), opts...)
			f.clock.Step(time.Hour)
			var needs bool
			if what == "pvc/c1" {
				c := f.binder.getClaim(ns, "c1")
				if c == nil {
					continue
				}
				needs = f.binder.claimNeedsWork(c)
			} else {
				pv := f.binder.getVolume(what[3:])
				if pv == nil {
					continue
				}
				needs = f.binder.volumeNeedsWork(pv)
			}
			_, err := f.runSync(what)
			writes := writesOnly(f.actions())
			events := f.events.take()
			if (len(writes) > 0 || len(events) > 0) && !needs {
				key := what
				fails[key]++
				if fails[key] <= 3 {
					t.Errorf("state %d (%s) inTree=%v: %s needsWork=false but writes %q events %q err %v", i, desc, inTree, what, writes, events, err)
				}
			}
		}
	}
	if len(fails) > 0 {
		t.Logf("states the resync skips although their sync acts, by object: %v", fails)
	}
}
