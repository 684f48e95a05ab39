// Package volindex declares the informer index of PersistentVolumes by the
// claim their claimRef names. The provisioner (to find the volume it made
// for a claim) and the binder (to find the volumes that reference a claim)
// both look volumes up this way; one shared index keeps one entry per
// volume instead of one per user, and at 10,000 volumes an index entry
// costs about 300 bytes.
package volindex

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// ByClaim is the index's name. Its keys are "namespace/name" of the claim a
// volume's claimRef names, whatever the UID; volumes without a claimRef are
// not in it.
const ByClaim = "csi-provisioner/volume-by-claim"

// Add adds the index to the volume informer unless it has it already, so
// that every user may call it. Call it before the informer starts.
func Add(inf cache.SharedIndexInformer) error {
	if _, ok := inf.GetIndexer().GetIndexers()[ByClaim]; ok {
		return nil
	}
	if err := inf.AddIndexers(cache.Indexers{ByClaim: byClaim}); err != nil {
		return fmt.Errorf("add the volume-by-claim index: %w", err)
	}
	return nil
}

func byClaim(obj any) ([]string, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil {
		return nil, nil
	}
	return []string{Key(pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name)}, nil
}

// Key is the index key of the claim namespace/name.
func Key(namespace, name string) string { return namespace + "/" + name }

// Volumes returns the cached volumes whose claimRef names the claim with
// key (see [Key]), in no particular order. They are the informer's objects:
// never modify them.
func Volumes(inf cache.SharedIndexInformer, key string) []*corev1.PersistentVolume {
	objs, err := inf.GetIndexer().ByIndex(ByClaim, key)
	if err != nil {
		return nil
	}
	out := make([]*corev1.PersistentVolume, 0, len(objs))
	for _, o := range objs {
		if pv, ok := o.(*corev1.PersistentVolume); ok {
			out = append(out, pv)
		}
	}
	return out
}
