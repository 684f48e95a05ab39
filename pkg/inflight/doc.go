// Package inflight owns the claim finalizer that makes provisioning crash-safe.
//
// While the finalizer is on a PersistentVolumeClaim, a CreateVolume for that
// claim may have been issued and the volume may exist in the driver without a
// PersistentVolume that records it. The finalizer keeps the claim object from
// disappearing in that window, even across a sidecar restart, so the
// provisioner can finish (or fail) the create and the volume is reclaimed
// through its PersistentVolume instead of leaking.
package inflight
