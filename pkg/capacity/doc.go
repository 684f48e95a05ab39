// Package capacity publishes the storage capacity of one CSI driver as
// CSIStorageCapacity objects (storage.k8s.io/v1), which kube-scheduler reads
// to place pods with WaitForFirstConsumer volumes only on nodes whose
// topology segment has room. It is upstream external-provisioner's
// --enable-capacity controller; the objects it writes are the same, so it
// can take over objects upstream published and the other way round.
//
// It never imports csiclient, the provisioner or gRPC: the driver is reached
// through [Driver], and everything else is API objects.
//
// # What it publishes
//
// One object per desired item, an item being a pair of a storage class and a
// topology segment:
//
//   - the classes are those whose provisioner is the driver and whose
//     binding mode is WaitForFirstConsumer, plus those with Immediate binding
//     under [WithImmediateBinding];
//   - the segments come from the CSINodes that list the driver with
//     topology keys: the segment of such a CSINode is the values of those
//     keys among the labels of the Node of the same name. A CSINode whose
//     Node is missing or lacks one of the keys gives no segment. Nodes with
//     equal values share a segment (typically, one per zone). A driver that
//     reports no topology keys has one empty segment (when a CSINode lists
//     it), and its objects' nodeTopology selects every node, as upstream's.
//
// In node deployment ([WithNodeDeployment]), a sidecar runs on every node
// and its controller publishes that node's segment only (the driver's
// NodeGetInfo topology), with managed-by=external-provisioner-<node>, so
// each node's controller sees and manages only its own objects.
//
// Each object lives in the namespace given to [New], is named by the API
// server (generateName "csisc-"), carries the labels
// csi.storage.k8s.io/drivername=<driver> and
// csi.storage.k8s.io/managed-by=external-provisioner and, with [WithOwner],
// an owner reference (see [LookupOwner]). Its storageClassName is the class,
// its nodeTopology selects the segment's labels, its capacity is
// GetCapacity's available capacity (zero included) and its maximumVolumeSize
// the response's maximum volume size, when there is one.
//
// Existing objects with both labels are adopted when they match an item
// (same class, nodeTopology with exactly the segment's labels and no match
// expressions). Objects that match no item are obsolete and deleted. When
// several objects match one item, the oldest is kept and the others are
// deleted. The controller never creates a second object for an item while
// the object it created is not yet in its informer cache, and never
// compares with a cached copy older than what it wrote: it remembers the
// objects it created or updated until the informer delivers that version. (A create that fails
// with a timeout may still have created an object; that object is adopted
// or, if another one was created meanwhile, deleted as a duplicate.)
//
// # The Driver contract
//
// [Driver.GetCapacity] is called with the class's parameters, the segment as
// accessible topology (none for the empty segment of a driver without
// topology keys, as the CSI spec requires of a plugin without
// VOLUME_ACCESSIBILITY_CONSTRAINTS) and no volume capabilities. It may be called
// concurrently (one call per worker) and must honour ctx. The controller adds
// no timeout of its own: the implementation is expected to bound each call.
// A non-nil error means the capacity is unknown: the object is left as it is
// (it is not zeroed) and the item is retried with exponential backoff
// ([WithRetry]), besides the periodic refresh. The returned
// available capacity is published as is, so zero means "full".
//
// # Refresh
//
// All work goes through one rate-limited workqueue named
// "csistoragecapacity" (so client-go's workqueue metrics carry that name),
// keyed by item (class and canonical segment) or by obsolete object. An item
// is queued:
//
//   - when it appears: a class, Node or CSINode change recomputes the
//     desired items; new items are queued, and the objects of items that
//     went away are queued for deletion;
//   - every poll interval ([WithPollInterval]), for every item;
//   - when a PersistentVolume of the driver is added, starts being deleted
//     or is deleted: the items of every class whose segment is compatible
//     with its node affinity (a segment's storage is shared by all
//     classes), or all of its class's items when it has no node affinity.
//     This refreshes capacity right after provisioning and deletion;
//   - when an unbound claim loses its selected-node annotation (the
//     provisioning library hands it back to the scheduler after
//     RESOURCE_EXHAUSTED on that node): every item of the claim's class, as
//     upstream refreshes a class after a failed provisioning, so that the
//     scheduler does not pick the same node on stale capacity again;
//   - when its object is deleted by someone else (it is created again), or
//     when it has more than one object.
//
// A sync of an item deletes duplicates, calls GetCapacity, and creates the
// object or updates it (Update, not Patch) when capacity, maximum volume
// size or owner differ; it writes nothing when nothing changed. A conflict
// is retried with backoff, with the version the informer delivers meanwhile.
//
// # Metrics
//
// With [WithMetricsRegistry], three ALPHA gauges without labels, computed on
// scrape: csistoragecapacities_desired_goal (desired items),
// csistoragecapacities_desired_current (desired items that have an object)
// and csistoragecapacities_obsolete (objects that match no item).
//
// # Concurrency
//
// Any number of workers is safe: the workqueue never hands the same key to
// two workers at once, and each object belongs to exactly one key. Only one
// controller per driver and namespace may run at a time (leader election);
// two would create duplicates, which both then delete again (both keep the
// oldest object of an item).
package capacity
