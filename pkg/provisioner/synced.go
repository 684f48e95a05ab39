package provisioner

import (
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// syncedVersions remembers, per claim UID, the resourceVersion of the claim
// the library last decided to provision (ShouldProvision returned true),
// so that the library's handlers do not get the update notification of
// that same version when it arrives after the sync.
//
// Why: the library syncs a claim from its informer's cache, which runs
// ahead of the notifications the informer delivers. When
// kube-controller-manager hands a new claim over, the claim's create
// queues it, a worker reads the handed-over version from the cache and
// provisions it, and then the notification of the hand-over queues it
// once more. That second sync finds the PV ("PersistentVolume already
// exists, skipping") or, when the PV is not cached yet, reaches Provision
// after a second Normal Provisioning event; both count a failure in
// controller_persistentvolumeclaim_provision_failed_total for a claim
// provisioned at the first try (test/e2e
// TestProvisionMetricsWithControllerManagerBinder, under load). Such a
// notification brings nothing the library has not seen: any later change
// comes with its own.
//
// A resync (the same version as before) always passes, and so does the
// requeue of a waiting claim, which does not go through the informer. An
// entry goes when a newer version of the claim arrives, or the claim is
// deleted. It is safe for concurrent use.
type syncedVersions struct {
	mu sync.Mutex
	rv map[types.UID]string
}

func newSyncedVersions() *syncedVersions {
	return &syncedVersions{rv: map[types.UID]string{}}
}

// record notes that the library decided on this version of claim.
func (s *syncedVersions) record(claim *corev1.PersistentVolumeClaim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv[claim.UID] = claim.ResourceVersion
}

// forget drops what is known of the claim with uid.
func (s *syncedVersions) forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.rv, uid)
}

// alreadySynced reports whether the informer update old → cur brings a
// version of a claim that the library already decided to provision. An
// update to a newer version drops the record.
func (s *syncedVersions) alreadySynced(old, cur interface{}) bool {
	o, ok1 := old.(*corev1.PersistentVolumeClaim)
	c, ok2 := cur.(*corev1.PersistentVolumeClaim)
	if !ok1 || !ok2 || o.ResourceVersion == c.ResourceVersion {
		return false // not a claim, or a resync
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rv, ok := s.rv[c.UID]
	switch {
	case !ok:
		return false
	case rv == c.ResourceVersion:
		return true
	case !olderVersion(c.ResourceVersion, rv):
		delete(s.rv, c.UID)
	}
	return false
}

// olderVersion reports whether resourceVersion a is known to be older than
// b. The API server's resourceVersions are opaque; kube-apiserver's are
// etcd revisions, which compare as integers. Anything else is not known to
// be older.
func olderVersion(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x < y
}
