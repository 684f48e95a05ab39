// Package provisioner turns PersistentVolumeClaims into CSI volumes and CSI
// volumes into PersistentVolumes. It implements the Provisioner, Qualifier
// and BlockProvisioner interfaces of sig-storage-lib-external-provisioner v13,
// whose ProvisionController drives it: PVC + StorageClass → CreateVolume
// request; response → PV; released PV → DeleteVolume.
//
// The behaviour is kubernetes-csi/external-provisioner's (v6): the same
// volume names, request and PV mapping, StorageClass parameters, secret
// templates, annotations, topology rules, event reasons and error states.
// Cloning from a claim follows upstream too, with its cloning-protection
// finalizer on the source (see clone.go and RunCloneProtection), and so
// does restoring from a VolumeSnapshot (snapshot.go, with the periodic sweep
// of orphaned snapshot finalizers in RunSnapshotSweep), also from another
// namespace when a ReferenceGrant allows it (WithReferenceGrants, the
// CrossNamespaceVolumeDataSource feature), and so does distributed
// provisioning (see Node deployment below). A clone waiting for its source
// to be Bound, a restore for its snapshot to be ready, or a claim for a
// ReferenceGrant, goes back to the library as soon as that happens, and so
// does a Released volume whose deletion waited for its detach
// (requeue.go). CSI migration and capacity
// tracking (package capacity) are not part of this package.
//
// # Error states
//
// [Provisioner.Provision] classifies a CreateVolume error with
// csiclient.Classify, with rescheduling allowed when the driver supports
// topology and the scheduler selected a node: InProgress →
// ProvisioningInBackground (the next call repeats the identical request,
// with the topology cached for the claim); Reschedule →
// ProvisioningReschedule; Infeasible and Final → ProvisioningFinished (an
// InvalidArgument error keeps its gRPC code so the library delays its
// retries). Errors before the call are ProvisioningFinished for requests
// that cannot be valid, ProvisioningNoChange for what may resolve (secrets,
// VolumeAttributesClass, topology lookups) and ProvisioningReschedule when
// the selected Node or CSINode is gone.
//
// # Crash-safe provisioning
//
// Upstream keeps "a CreateVolume for this claim may be running" in memory
// only: a restart in the middle, followed by the deletion of the claim,
// leaks the volume (external-provisioner issue #486). Here the claim itself
// carries that state, as the finalizer inflight.Finalizer:
//
//  1. Before the first CreateVolume for a claim, the finalizer is on the
//     claim: the binder adds it in the write that hands the claim to this
//     driver (after [Provisioner.CheckProvision] said a request can be
//     built), or Provision adds it with a live update right before the call.
//     No CreateVolume is sent unless the claim's current copy carries it,
//     and none for a claim that is being deleted without it: the API server
//     refuses new finalizers on such a claim, and [Provisioner.ShouldProvision]
//     turns it down.
//  2. While the finalizer is on, the claim cannot disappear; if it is being
//     deleted, ShouldProvision still accepts it, so that the create is
//     finished (and its PV written) or fails.
//  3. The finalizer comes off when no CreateVolume can leak any more. (a)
//     The PV provisioned for the claim exists: the binder removes the
//     finalizer in the write that binds the claim, and the guard
//     ([Provisioner.RunGuard]) removes it once the PV exists and the claim
//     is bound (by any binder), being deleted, or the binder is disabled.
//     (b) For a claim that is being deleted (or bound to another volume),
//     no CreateVolume is in flight: the driver gave a final answer to the
//     last one, or this process saw the claim without the finalizer and
//     sent none since. Provision removes the finalizer right away, or the
//     guard does when the claim is deleted later. A final answer proves
//     that no volume of that name exists, except AlreadyExists, which
//     proves that one does: then the finalizer stays. This knowledge is in
//     memory, and assumes that one process provisions for the driver at a
//     time (leader election) and runs both the library's controller and
//     the guard.
//
// How each crash ends without a leak:
//
//   - Before the finalizer write: nothing was sent. A claim deleted
//     meanwhile never gets a CreateVolume; a live one is provisioned anew.
//   - After the finalizer write, before CreateVolume: the claim stays.
//     After the restart a live claim is provisioned normally; a claim being
//     deleted gets a CreateVolume anyway (nothing tells the new process
//     that none was sent): either a final answer, and the finalizer comes
//     off, or a volume whose PV is written, after which the finalizer comes
//     off, the claim goes, and the PV is Released and deleted with its
//     volume.
//   - During CreateVolume: the same; the repeated call, idempotent by the
//     volume name, returns or finishes the volume the lost call created.
//   - After CreateVolume succeeded, before the PV write: the same; the
//     repeated CreateVolume returns the existing volume and the PV is
//     written. (The topology cache is lost with the process; if the new
//     request differs and the driver answers AlreadyExists, the finalizer
//     stays and the error says what to clean up.)
//   - After the PV write: the PV records the volume. The guard or the
//     binder removes the finalizer; a deleted claim's PV is Released and
//     its volume deleted.
//
// A claim sent back to the scheduler (the library's reschedule: the
// driver answered RESOURCE_EXHAUSTED for the selected node, or the node is
// gone) loses the finalizer in the same write when nothing is in flight,
// and gets it again before its next CreateVolume: a later process that
// sees it deleted need not know that answer.
//
// What is left to an administrator, with a Warning event or error on the
// claim: a claim answered AlreadyExists; and, when this process cannot
// know that nothing is in flight (it restarted after the finalizer was
// added), a claim being deleted whose request can no longer be built (its
// secret was deleted, say), a late-binding claim being deleted without a
// selected node (the node of the lost create was deleted, so the claim was
// sent back to the scheduler; no CreateVolume can be sent without a node),
// and a claim that another binder bound to a different volume. Each keeps
// the finalizer until the volume named after the claim is known not to
// exist, or an administrator who checked the storage backend removes it.
//
// # Node deployment
//
// With [WithNodeDeployment] (upstream's --node-deployment) one provisioner
// runs on every node, next to a driver instance that can only create
// volumes on that node, and each provisions and deletes only what is its
// node's:
//
//   - Topology comes from this node alone: the Node and CSINode that the
//     topology rules read are static copies built from the driver's
//     NodeGetInfo, not informers, so no sidecar watches every Node.
//   - A claim whose volume.kubernetes.io/selected-node names this node is
//     provisioned here; one naming another node is left to that node,
//     silently (not an error), also when that node is gone for good: no
//     node can tell that its sidecar will not send CreateVolume any more,
//     so an administrator releases such a claim (see the README). A claim
//     with delayed binding waits for the scheduler to select a node.
//   - A claim with Immediate binding and no selected node is taken, when
//     ImmediateBinding is on, by the first node that sets selected-node to
//     itself, among the nodes that the class's allowedTopologies allow
//     (with topology support, as upstream): each node waits a per-claim delay that grows with every
//     attempt (BaseDelay doubling up to MaxDelay, with jitter) while
//     looking whether another node took it, then, with GetCapacity, checks
//     that the volume fits on this node, then writes the annotation. A
//     conflicting write means another node won. This happens in
//     ShouldProvision, as upstream, so that the library posts its
//     "Provisioning" event only on the node that took the claim; the claim
//     is provisioned when it comes back with this node selected. A node that
//     lacks the capacity tries again the next time the library syncs the
//     claim (an update of the claim, or the library's resync), or as soon
//     as a volume of this node is deleted (the claim is handed back to the
//     library, see requeue.go).
//   - An Immediate claim that no node takes is explained by one Warning
//     ProvisioningFailed event (nodewait.go): a node that declined it for
//     capacity posts it if the claim is still untaken 1.5 × MaxDelay
//     later, and with ImmediateBinding off the first node to see the claim
//     posts it at once. All nodes give the event the same name, so the
//     first create wins and the claim gets one, however many nodes decline.
//     The wait and the retries of a failed post run in goroutines that
//     end with the sidecar: RunGuard ends them and waits for them when its
//     context ends (background.go).
//   - A PV is deleted by the node its node affinity allows; every other
//     node ignores it (ShouldDelete turns it down, so the library neither
//     calls Delete nor counts a deletion in its metrics). A PV without
//     node affinity is never deleted in this mode: each node's driver
//     would answer DeleteVolume for a volume it does not have with success
//     (CSI deletes are idempotent), so the PV would be removed while the
//     real volume leaks on its node. Such PVs are left to an
//     administrator, with a Warning VolumeFailedDelete event on the PV
//     from every node. A driver that reports no topology has no
//     node-local volumes: any node deletes its PVs, as upstream.
//   - The in-flight guard of a node acts only on claims selected for that
//     node (and on a delayed-binding claim this node rescheduled after a
//     final answer, which no node takes until the scheduler selects one
//     again): its knowledge that no CreateVolume is in flight holds for
//     this process only, and the selected-node annotation says which
//     process may send CreateVolume for a claim. That annotation changes
//     only after a final answer (rescheduling), so at most one node has a
//     create in flight for a claim.
//
// # Events
//
// The library reports every error Provision returns as a ProvisioningFailed
// Warning event (with its own recorder, on every retry). This package reports
// what the library is silent about, through the recorder given to [New]
// (deduplicated, so once per cause): a missing StorageClass or one that
// names another provisioner (from ShouldProvision), an external populator's
// data source (upstream's Normal Provisioning event), and a claim stuck with
// the finalizer after another binder bound it.
package provisioner
