// Package volindex declares the informer index of PersistentVolumes by the
// claim their claimRef names. The provisioner (to find the volume it made
// for a claim) and the binder (to find the volumes that reference a claim)
// both look volumes up this way; one shared index keeps one entry per
// volume instead of one per user.
//
// An index entry costs about 250 bytes (client-go keeps a set per indexed
// value), so the index leaves out the volumes whose name already says which
// claim they belong to: a volume this sidecar provisions is named
// <prefix>-<claim UID>, and a lookup for a claim fetches that name from the
// cache directly. Only volumes named otherwise (static ones, those of
// another naming, claimRefs without UID or edited by hand) take an entry.
package volindex

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// ByClaim is the name of the index without a prefix; an index with prefix
// p is named ByClaim + "/" + p. Its keys are "namespace/name" of the claim a
// volume's claimRef names, whatever the UID; volumes without a claimRef are
// not in it.
const ByClaim = "csi-provisioner/volume-by-claim"

// Index is the volume-by-claim index of one volume informer.
type Index struct {
	indexer cache.Indexer
	name    string
	prefix  string
}

// Add adds the index to the volume informer unless it has it already, so
// that every user may call it, and returns it. Call it before the informer
// starts.
//
// With a prefix, volumes named prefix + "-" + their claimRef's UID are not
// indexed; pass the prefix only when every volume the sidecar provisions is
// named so (full UIDs, not truncated ones). Users that pass the same prefix
// share one index.
func Add(inf cache.SharedIndexInformer, prefix string) (*Index, error) {
	x := &Index{indexer: inf.GetIndexer(), name: ByClaim, prefix: prefix}
	if prefix != "" {
		x.name += "/" + prefix
	}
	if _, ok := x.indexer.GetIndexers()[x.name]; ok {
		return x, nil
	}
	if err := inf.AddIndexers(cache.Indexers{x.name: x.index}); err != nil {
		return nil, fmt.Errorf("add the volume-by-claim index: %w", err)
	}
	return x, nil
}

func (x *Index) index(obj any) ([]string, error) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil || x.namedAfterClaim(pv) {
		return nil, nil
	}
	return []string{Key(pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name)}, nil
}

// namedAfterClaim reports whether pv is named after its claimRef's UID, and
// so not in the index.
func (x *Index) namedAfterClaim(pv *corev1.PersistentVolume) bool {
	ref := pv.Spec.ClaimRef
	uid, ok := x.UIDOf(pv.Name)
	return ok && ref != nil && uid == ref.UID
}

// UIDOf returns the claim UID a volume name holds: the part after the
// prefix and a dash. It reports false without a prefix, for names that do
// not start with it, and for an empty rest. It allocates nothing, so index
// functions, which run on every event, may call it.
func (x *Index) UIDOf(volumeName string) (types.UID, bool) {
	if x.prefix == "" || len(volumeName) < len(x.prefix)+2 ||
		volumeName[:len(x.prefix)] != x.prefix || volumeName[len(x.prefix)] != '-' {
		return "", false
	}
	return types.UID(volumeName[len(x.prefix)+1:]), true
}

// VolumeName returns the name of the volume provisioned for the claim with
// uid, "" without a prefix.
func (x *Index) VolumeName(uid types.UID) string {
	if x.prefix == "" || uid == "" {
		return ""
	}
	return x.prefix + "-" + string(uid)
}

// Name returns the name of the index in the informer.
func (x *Index) Name() string { return x.name }

// Key is the index key of the claim namespace/name.
func Key(namespace, name string) string { return namespace + "/" + name }

// Volumes returns the cached volumes whose claimRef names the claim
// namespace/name, in no particular order: every such volume except those
// named after a claimRef UID other than uid, which belong to earlier claims
// of the same name. They are the informer's objects: never modify them.
func (x *Index) Volumes(namespace, name string, uid types.UID) []*corev1.PersistentVolume {
	objs, err := x.indexer.ByIndex(x.name, Key(namespace, name))
	if err != nil {
		return nil
	}
	out := make([]*corev1.PersistentVolume, 0, len(objs)+1)
	for _, o := range objs {
		if pv, ok := o.(*corev1.PersistentVolume); ok {
			out = append(out, pv)
		}
	}
	if own := x.VolumeName(uid); own != "" {
		// Not in the index when named after its claimRef, so not already
		// in out.
		if o, ok, _ := x.indexer.GetByKey(own); ok {
			if pv, ok := o.(*corev1.PersistentVolume); ok && x.namedAfterClaim(pv) &&
				pv.Spec.ClaimRef.Namespace == namespace && pv.Spec.ClaimRef.Name == name {
				out = append(out, pv)
			}
		}
	}
	return out
}
