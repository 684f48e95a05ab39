// Package binder binds PersistentVolumeClaims to PersistentVolumes and
// reclaims released volumes for one CSI driver: the job of
// kube-controller-manager's persistentvolume-binder, scoped to the claims and
// volumes of this driver, so that a cluster does not need that controller for
// them.
//
// It never imports csiclient or gRPC: it only reads and writes API objects.
//
// # What it does
//
// The binder follows the in-tree controller's state machine and writes the
// same annotations, phases and events, so the scheduler, the provisioner
// library and tooling see no difference:
//
//   - a pending claim is bound to the best matching static volume (fewest
//     extra access modes, then smallest); a claim of a WaitForFirstConsumer
//     class waits for the scheduler (WaitForFirstConsumer or
//     WaitForPodScheduled event); a claim with a selected node is never
//     given an unbound static volume, only one pre-bound to it;
//   - a pending claim with no class at all (created while no class was
//     default) that no static volume fits takes the default class when that
//     class is this driver's (retroactive default class, as upstream);
//   - otherwise the claim is handed to this driver's provisioner: both
//     storage-provisioner annotations are set in one update that also adds
//     the in-flight finalizer (package inflight) when the [ProvisionChecker]
//     accepts the claim. No event is posted on this path; a claim still
//     unbound after the provisioning grace gets one ExternalProvisioning
//     event;
//   - binding takes four writes, volume first (claimRef, volume phase, claim
//     volumeName and annotations, claim status); each is skipped when it
//     changes nothing, and every state between two writes is finished by the
//     next sync. The third write also removes the in-flight finalizer, but
//     only when the volume is the one this driver provisioned for the claim
//     (a create may still be running otherwise; the provisioner's guard
//     removes it later). Once another writer is seen to add or change a
//     claim's Unused condition (kube-controller-manager v1.37), the status
//     write carries it too, so that controller has nothing to write
//     (unused.go);
//   - a volume whose claim is gone becomes Released; the provisioner then
//     deletes it (Delete; a static in-tree volume of the migrated plugin
//     that it does not delete gets a Warning) or it stays (Retain); Recycle
//     and unknown policies make it Failed with a Warning. Before releasing, a claim missing from
//     the cache is read from the API server, and a claim found with another
//     UID is read again, so a freshly provisioned volume is never released
//     because its claim was not cached yet. Likewise, a bound claim whose
//     volume is not cached becomes Lost only once the API server has no such
//     volume either. Beyond upstream, a volume is
//     neither released, nor unbound, nor bound to another claim while
//     another existing claim is still bound to it (bind-completed and
//     spec.volumeName naming it, being deleted or not: pvc-protection
//     keeps a claim while pods use it; and bound by a binder, not marked so
//     by its user: see [AnnBoundClaims]), which only a hand edit of
//     spec.claimRef (renamed, moved to another claim by name, or removed)
//     can cause: releasing would delete or hand out that claim's data. A Warning
//     VolumeStillInUse says how to fix it. A bound claim whose volume's
//     claimRef names it without a UID (removed by hand) binds it again
//     instead of becoming Lost (ClaimMisbound) as upstream's does, unless
//     another claim is still bound to the volume. A claim no binder bound
//     (its user set bind-completed) re-binds a volume whose claimRef was
//     removed only if the volume fits it, as a claim its user pre-bound;
//     upstream re-binds it unchecked.
//     The binder never calls the driver and touches no volume finalizer
//     but kube-controller-manager's in-tree kubernetes.io/pv-controller on
//     a volume the migrated in-tree plugin provisioned, which it removes
//     (and names the driver in pv.kubernetes.io/migrated-to) as that
//     binder does with migration on.
//
// Scope: the binder writes a volume only when spec.csi.driver is the driver
// or pv.kubernetes.io/provisioned-by names it (or, with
// [WithInTreeMigration], the migrated in-tree plugin, whose in-tree volumes
// count too), and a claim only when its class's provisioner is the driver
// (or that plugin), when it is bound or pre-bound to such a
// volume, when such a volume is pre-bound to it, or when such a volume
// matches it (a claim of another provisioner's class too, as
// kube-controller-manager's binder binds static volumes before it hands a
// claim to its provisioner). A claim that is nobody's (its class does not
// exist, or it has none, and no volume fits it) is not written, but gets
// kube-controller-manager's event about it, ProvisioningFailed or
// FailedBinding, from one binder in the cluster (unowned.go). A claim of
// the driver's class that a volume out of scope fits (in its class, or
// pre-bound to it) is left to kube-controller-manager's binder, which binds
// it, as upstream, where such a claim is never provisioned: it is not
// written, and gets one Normal ExternalBinding after the provisioning grace.
//
// Events go through an events.Deduplicator: each cause is reported once per
// object, not once per retry.
//
// # Concurrency
//
// The claim and volume queues each run [WithWorkers] workers. That is safe
// because:
//
//   - the queue never hands one key to two workers at once;
//   - matching a claim to a volume not yet reserved for it and writing the
//     reservation (the volume's claimRef, stored in the binder's own-writes
//     cache before the lock is released) happen under one mutex, so two
//     claims can never be matched to one volume. This covers the pre-bound
//     claim and re-bind cases too, which re-check the newest copy under the
//     mutex;
//   - everything else runs without the mutex: handing claims to the
//     provisioner, finishing a binding to a volume already reserved for the
//     claim, status writes, volume syncs;
//   - every write carries the resourceVersion of the copy it was computed
//     from, so the API server rejects a write based on a stale copy (a
//     conflict, retried quietly).
//
// The binder reads every object as the newer of the informer's copy and the
// copy its own last write returned (by resourceVersion), and forgets its own
// copy once the informer has caught up.
//
// # Resync
//
// Every [WithResyncPeriod] (default 15s, like --pvclaimbinder-sync-period) the
// binder queues the objects that may need work, not every object: a settled
// binding (claim Bound with bind-completed, volume Bound pointing back with
// the claim's UID, no in-flight finalizer), an Available unbound volume, a
// Released volume kept by Retain or left to the provisioner by Delete, and
// objects out of scope are skipped. A test checks over thousands of generated
// states that the sync of a skipped object would neither write nor report
// anything. Event handlers also queue more than upstream: a volume that
// becomes Available queues the pending claims of its class, a volume with a
// claimRef queues that claim, a deleted claim queues its volume, a class
// change queues its pending claims, an unscheduled pod queues its claims.
//
// # Metrics
//
// Registered with [WithMetricsRegistry] (nothing is registered without it):
//
//   - csi_provisioner_binder_bound_pv_count{storage_class},
//     csi_provisioner_binder_unbound_pv_count{storage_class}: volumes in scope
//     in phase Bound, and in any other phase;
//   - csi_provisioner_binder_bound_pvc_count{storage_class},
//     csi_provisioner_binder_unbound_pvc_count{storage_class}: claims in scope
//     (class of this driver, or bound to a volume in scope) in phase Bound,
//     and in any other phase;
//   - csi_provisioner_binder_binding_duration_seconds{storage_class}:
//     histogram of the time from a claim's creation to the binder setting it
//     Bound;
//   - csi_provisioner_binder_writes_total{resource,verb,result}: API writes,
//     resource persistentvolumes or persistentvolumeclaims, verb update or
//     update_status, result success, conflict or error.
//
// The four counts are computed on scrape with one pass over the informer
// caches; they cost nothing between scrapes. The work queues are named
// binder_claims and binder_volumes for client-go's workqueue metrics.
//
// # Wiring
//
// cmd/csi-provisioner builds one shared informer factory, constructs the
// binder and the provisioner on it, starts the factory and runs both:
//
//	factory := informers.NewSharedInformerFactory(client, 0)
//	b, err := binder.New(client, driverName, factory,
//		binder.WithResyncPeriod(cfg.BinderSyncPeriod),
//		binder.WithWorkers(cfg.BinderWorkers),
//		binder.WithProvisionCheck(prov),
//		binder.WithEventRecorder(dedup), // shared with the provisioner
//		binder.WithMetricsRegistry(registry))
//	if err != nil {
//		return err
//	}
//	factory.Start(ctx.Done())
//	go func() { errs <- b.Run(ctx) }()
//
// Run waits for the caches and returns once its workers have stopped after
// ctx is done. New and Run work the same with a real clientset, which is what
// integration tests use. Pods in the shared cache may be trimmed to their
// metadata, spec.volumes, spec.nodeName and status.phase.
package binder
