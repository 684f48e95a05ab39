package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
	libmetrics "sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller/metrics"

	"github.com/kube-storage/csi-provisioner/internal/cachetrim"
	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// informerResync is the shared informers' resync period, as upstream's
// factory; the provisioner library re-drives claims from it every 15 minutes.
const informerResync = time.Hour

// runSidecar connects to the driver and the API server, builds the
// components and runs them until ctx is done.
func runSidecar(ctx context.Context, cfg *Config) error {
	logger := klog.FromContext(ctx)
	restCfg, err := buildRESTConfig(cfg)
	if err != nil {
		return err
	}
	// With leader election every client but the election's own writes only
	// while this process holds the Lease (see fence).
	electionCfg := restCfg
	var leaseFence *fence
	if cfg.LeaderElection {
		electionCfg = rest.CopyConfig(restCfg)
		leaseFence = newFence(cfg.LeaderElectionLeaseDuration, func(reason string) {
			logger.Error(nil, "Stopped leading", "reason", reason)
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		})
		restCfg.Wrap(leaseFence.wrap)
	}
	main, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("create Kubernetes client: %w", err)
	}
	eventClient, err := kubernetes.NewForConfig(restCfg) // same limits, own budget
	if err != nil {
		return fmt.Errorf("create Kubernetes event client: %w", err)
	}
	// Custom resources are served as JSON only; the snapshot client has its
	// own rate budget, as upstream's.
	snapCfg := rest.CopyConfig(restCfg)
	snapCfg.ContentType, snapCfg.AcceptContentTypes = "application/json", "application/json"
	snapshots, err := snapclient.NewForConfig(snapCfg)
	if err != nil {
		return fmt.Errorf("create VolumeSnapshot client: %w", err)
	}
	unwritten := &unwrittenEvents{}
	writer := events.NewWriter(eventClient.CoreV1().Events(""), events.WriterOptions{Supersedes: supersededEvents, OnDrop: unwritten.dropped})
	// The event writer and broadcasters outlive the stop signal: the
	// controllers stop first, then finish hands what they recorded to the
	// writer and lets it write what is queued (for up to its drain
	// timeout). Every return runs finish; with leader election, whose end
	// exits the process, the leader runs it before it lets the Lease go.
	keep := context.WithoutCancel(ctx)
	writerCtx, stopWriter := context.WithCancel(keep)
	writerDone := make(chan struct{})
	go func() { defer close(writerDone); writer.Run(writerCtx) }()
	var broadcaster record.EventBroadcaster
	finish := sync.OnceFunc(func() {
		if broadcaster != nil {
			broadcaster.Shutdown() // delivers what it has queued
		}
		stopWriter()
		<-writerDone
	})
	defer finish()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	client := newEventSplitClient(main, eventClient, writer)

	health := newHealth()
	srv, err := startHTTP(ctx, cfg, health)
	if err != nil {
		return err
	}

	driver, mm, inTree, err := connectDriver(ctx, cfg, driverOptions(leaseFence)...)
	if err != nil {
		return err
	}
	defer func() { _ = driver.Close() }()
	driverName := driver.Capabilities().DriverName
	health.add("csi-driver", func(ctx context.Context) error { return driver.Probe(ctx) })
	// Not ready during the start-up checks below (each retried for minutes
	// while the API server fails): a rolling update must not move on.
	var startedUp atomic.Bool
	health.add("start-up", func(context.Context) error {
		if !startedUp.Load() {
			return errors.New("start-up checks under way")
		}
		return nil
	})
	node, err := nodeDeployment(ctx, cfg, driver)
	if err != nil {
		return err
	}

	factory := informers.NewSharedInformerFactoryWithOptions(client, informerResync, informers.WithTransform(cachetrim.New().Transform))
	broadcaster = newBroadcaster(keep, client)
	recorder := newRecorder(broadcaster, "external-provisioner", unwritten)

	provOpts := []provisioner.Option{
		provisioner.WithVolumeNamePrefix(cfg.VolumeNamePrefix),
		provisioner.WithVolumeNameUUIDLength(cfg.VolumeNameUUIDLength),
		provisioner.WithDefaultFSType(cfg.DefaultFSType),
		provisioner.WithExtraCreateMetadata(cfg.ExtraCreateMetadata),
		provisioner.WithStrictTopology(cfg.StrictTopology),
		provisioner.WithImmediateTopology(cfg.ImmediateTopology),
		provisioner.WithTopology(cfg.FeatureGates.Enabled(FeatureTopology)),
		provisioner.WithControllerPublishReadOnly(cfg.ControllerPublishReadOnly),
		provisioner.WithEventRecorder(recorder),
		provisioner.WithBinderEnabled(cfg.EnableBinder),
		provisioner.WithVolumeAttributesClass(cfg.FeatureGates.Enabled(FeatureVolumeAttributesClass)),
		provisioner.WithVolumeAttributesClassesServed(volumeAttributesClassesServed(ctx, cfg.FeatureGates, retryingDiscovery{main.Discovery()})),
		provisioner.WithSnapshotClient(snapshots),
		provisioner.WithPreventVolumeModeConversion(cfg.PreventVolumeModeConversion),
		provisioner.WithRetryIntervals(cfg.RetryIntervalStart, cfg.RetryIntervalMax),
	}
	if node != nil {
		provOpts = append(provOpts, provisioner.WithNodeDeployment(*node))
	}
	if inTree != "" {
		provOpts = append(provOpts, provisioner.WithInTreeMigration(inTree))
	}
	sources, err := newSourceInformers(ctx, cfg, restCfg, main, snapshots, driver.Capabilities())
	if err != nil {
		return err
	}
	provOpts = append(provOpts, sources.options()...)
	prov, err := provisioner.New(client, driver, factory, provOpts...)
	if err != nil {
		return fmt.Errorf("create provisioner: %w", err)
	}
	if err := sources.watch(prov); err != nil {
		return err
	}

	lib := newProvisionController(keep, cfg, client, driverName, inTree, prov, factory, srv) // its event broadcaster outlives the signal too

	var bnd *binder.Binder
	if cfg.EnableBinder {
		if err := checkBinderAccess(ctx, main); err != nil {
			return err
		}
		binderRecorder := newRecorder(broadcaster, "csi-provisioner-binder", unwritten)
		bnd, err = binder.New(client, driverName, factory,
			binder.WithResyncPeriod(cfg.BinderResyncPeriod),
			binder.WithWorkers(cfg.BinderWorkers),
			binder.WithEventRecorder(binderRecorder),
			binder.WithProvisionCheck(prov),
			binder.WithUIDNamedVolumes(prov.UIDNamePrefix()),
			binder.WithMetricsRegistry(srv.kubeRegistry),
			binder.WithInTreeMigration(inTree),
		)
		if err != nil {
			return fmt.Errorf("create binder: %w", err)
		}
	}
	capacityCtl, err := newCapacity(ctx, cfg, restCfg, driver, node, factory, srv.kubeRegistry)
	if err != nil {
		return err
	}
	srv.serveMetrics(cfg, mm)

	run := func(ctx context.Context) {
		logger := klog.FromContext(ctx)
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		var wg sync.WaitGroup
		defer wg.Wait() // before the factory shuts down
		if bnd != nil {
			wg.Go(func() {
				if err := bnd.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
					logger.Error(err, "Binder stopped")
				}
			})
		}
		wg.Go(func() { prov.RunGuard(ctx, 1) })
		wg.Go(func() { prov.RunCloneProtection(ctx, cfg.CloningProtectionThreads) })
		wg.Go(func() { prov.RunSnapshotSweep(ctx, cfg.SnapshotOrphanSweepInterval) })
		synced := map[string]func() bool{"provisioner": prov.HasSynced, "binder": hasSynced(bnd)}
		if capacityCtl != nil {
			wg.Go(func() { capacityCtl.Run(ctx, cfg.CapacityThreads) })
			synced["capacity"] = capacityCtl.HasSynced
		}
		sources.run(ctx, &wg, synced)
		// The library waits for its own informers only; the provisioner
		// also reads attachments, nodes, CSINodes and the grants.
		if !awaitCaches(ctx, health, synced, prov.HasSynced, sources.hasSynced) {
			return
		}
		runLibrary(ctx, lib, &wg)
	}

	var leClient kubernetes.Interface
	if cfg.LeaderElection {
		if leClient, err = kubernetes.NewForConfig(electionCfg); err != nil {
			return fmt.Errorf("create the leader election client: %w", err)
		}
	}
	startedUp.Store(true)
	logger.Info("Running", "driver", driverName, "binder", cfg.EnableBinder, "leaderElection", cfg.LeaderElection)
	if cfg.LeaderElection {
		return runWithLeaderElection(ctx, cfg, leClient, leaseFence, driverName, srv, run, finish)
	}
	run(ctx)
	logger.Info("Stopped")
	return nil
}

// awaitCaches registers the "informers" readiness check, which fails while
// any of synced has not synced, and then waits until waitFor have synced.
// In this order /readyz says "not ready" during the initial sync. It
// returns false when ctx ends first.
func awaitCaches(ctx context.Context, health *health, synced map[string]func() bool, waitFor ...cache.InformerSynced) bool {
	health.add("informers", func(context.Context) error {
		for name, hasSynced := range synced {
			if !hasSynced() {
				return fmt.Errorf("%s caches not synced", name)
			}
		}
		return nil
	})
	return cache.WaitForCacheSync(ctx.Done(), waitFor...)
}

// nodeDeployment returns, with --node-deployment, what the provisioner
// needs to serve this node only: the driver's node ID and topology from its
// node service, and the flags; nil without it.
func nodeDeployment(ctx context.Context, cfg *Config, driver *csiclient.Client) (*provisioner.NodeDeployment, error) {
	if !cfg.NodeDeployment {
		return nil, nil
	}
	caps := driver.Capabilities()
	info, err := driver.NodeGetInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("--node-deployment: ask the CSI driver %q at %q for its node (NodeGetInfo of its node service): %w", caps.DriverName, cfg.CSIAddress, err)
	}
	nd := &provisioner.NodeDeployment{
		NodeName:         cfg.NodeName,
		NodeID:           info.GetNodeId(),
		Topology:         info.GetAccessibleTopology().GetSegments(),
		ImmediateBinding: cfg.NodeDeploymentImmediateBinding,
		BaseDelay:        cfg.NodeDeploymentBaseDelay,
		MaxDelay:         cfg.NodeDeploymentMaxDelay,
	}
	if caps.GetCapacity {
		nd.GetCapacity = driver.GetCapacity
	}
	klog.FromContext(ctx).Info("Node deployment: provisioning for this node only", "node", nd.NodeName, "nodeID", nd.NodeID, "topology", nd.Topology)
	return nd, nil
}

// newProvisionController builds the provisioning library's controller
// around prov, on the shared informers, with its metrics in srv's library
// registry. Leader election is ours (as upstream), and failures are retried
// for ever with the --retry-interval-* backoff. With CSI migration the
// library also takes the in-tree plugin's PVs as ours (inTree, "" for
// none).
func newProvisionController(ctx context.Context, cfg *Config, client kubernetes.Interface, driverName, inTree string, prov *provisioner.Provisioner, factory informers.SharedInformerFactory, srv *httpServer) *controller.ProvisionController {
	libMetrics := libmetrics.New("controller")
	for _, c := range []prometheus.Collector{
		libMetrics.PersistentVolumeClaimProvisionTotal, libMetrics.PersistentVolumeClaimProvisionFailedTotal,
		libMetrics.PersistentVolumeClaimProvisionDurationSeconds, libMetrics.PersistentVolumeDeleteTotal,
		libMetrics.PersistentVolumeDeleteFailedTotal, libMetrics.PersistentVolumeDeleteDurationSeconds,
	} {
		srv.libRegistry.MustRegister(c)
	}
	opts := []func(*controller.ProvisionController) error{
		controller.LeaderElection(false),
		controller.FailedProvisionThreshold(0),
		controller.FailedDeleteThreshold(0),
		controller.RateLimiter(workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.RetryIntervalStart, cfg.RetryIntervalMax)),
		controller.Threadiness(cfg.WorkerThreads),
		controller.CreateProvisionedPVLimiter(workqueue.DefaultTypedControllerRateLimiter[string]()),
		controller.ClaimsInformer(prov.LibraryClaimsInformer()),
		controller.VolumesInformer(prov.LibraryVolumesInformer()),
		controller.ClassesInformer(factory.Storage().V1().StorageClasses().Informer()),
		controller.RetryIntervalMax(cfg.RetryIntervalMax),
		controller.AddFinalizer(true),
		controller.VolumeName(prov.VolumeName),
		controller.MetricsInstance(libMetrics),
	}
	if inTree != "" {
		opts = append(opts, controller.AdditionalProvisionerNames([]string{inTree}))
	}
	return controller.NewProvisionController(ctx, prov.LibraryClient(client), driverName, prov, opts...)
}

// runLibrary runs the provisioning library's controller until ctx is done.
// Its workers are added to wg (as upstream does with the
// ReleaseLeaderElectionOnExit gate): lib.Run returns when ctx is done, its
// workers when the item each one is on is finished, and wg.Wait waits for
// them, so that no worker still records events or writes after the stop
// has written the queued events and, with leader election, let the Lease
// go.
func runLibrary(ctx context.Context, lib *controller.ProvisionController, wg *sync.WaitGroup) {
	lib.ControllerWaitGroup(wg)
	lib.Run(ctx)
}

// connectDriver connects to the driver, checks that it provisions volumes,
// and returns it with the metrics manager of its calls and the in-tree
// volume plugin whose volumes it took over (CSI migration, per
// csi-translation-lib; "" for none). For such a driver it connects again
// with a manager that has upstream's "migrated" label, as upstream does:
// the driver's name is known only once connected.
func connectDriver(ctx context.Context, cfg *Config, extra ...csiclient.Option) (*csiclient.Client, metrics.CSIMetricsManager, string, error) {
	connect := func(migration bool) (*csiclient.Client, metrics.CSIMetricsManager, error) {
		opts := []metrics.MetricsManagerOption{metrics.WithProcessStartTime(false), metrics.WithSubsystem(metrics.SubsystemSidecar)}
		if migration {
			opts = append(opts, metrics.WithMigration())
		}
		mm := metrics.NewCSIMetricsManagerWithOptions("", opts...)
		driver, err := csiclient.Connect(ctx, cfg.CSIAddress, append([]csiclient.Option{
			csiclient.WithCallTimeout(cfg.Timeout),
			csiclient.WithConnectTimeout(cfg.CSIConnectTimeout),
			csiclient.WithMetrics(mm)}, extra...)...)
		return driver, mm, err
	}
	driver, mm, err := connect(false)
	if err != nil {
		return nil, nil, "", err
	}
	caps := driver.Capabilities()
	if !caps.ControllerService || !caps.CreateDeleteVolume {
		_ = driver.Close()
		return nil, nil, "", fmt.Errorf("CSI driver %q at %q does not provision volumes: it lacks the CONTROLLER_SERVICE plugin capability or the CREATE_DELETE_VOLUME controller capability", caps.DriverName, cfg.CSIAddress)
	}
	trans := csitrans.New()
	if !trans.IsMigratedCSIDriverByName(caps.DriverName) {
		return driver, mm, "", nil
	}
	inTree, err := trans.GetInTreeNameFromCSIName(caps.DriverName)
	_ = driver.Close()
	if err != nil {
		return nil, nil, "", fmt.Errorf("CSI migration of driver %s: %w", caps.DriverName, err)
	}
	klog.FromContext(ctx).Info("CSI migration: provisioning for the in-tree plugin's storage classes too", "inTreePlugin", inTree)
	if driver, mm, err = connect(true); err != nil {
		return nil, nil, "", err
	}
	return driver, mm, inTree, nil
}

func hasSynced(b *binder.Binder) func() bool {
	if b == nil {
		return func() bool { return true }
	}
	return b.HasSynced
}

// buildRESTConfig builds the client configuration as upstream: KUBECONFIG
// wins over --kubeconfig; neither and no --master means in-cluster.
func buildRESTConfig(cfg *Config) (*rest.Config, error) {
	kubeconfig := cfg.Kubeconfig
	source := fmt.Sprintf("--kubeconfig %q", kubeconfig) // where kubeconfig came from, for the error
	if env := os.Getenv("KUBECONFIG"); env != "" {
		kubeconfig = env
		source = fmt.Sprintf("$KUBECONFIG %q", env)
		if cfg.Kubeconfig != "" {
			source += fmt.Sprintf(", which wins over --kubeconfig %q", cfg.Kubeconfig)
		}
	}
	var restCfg *rest.Config
	var err error
	if kubeconfig != "" || cfg.Master != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags(cfg.Master, kubeconfig)
	} else {
		restCfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("build the Kubernetes client configuration (%s, --master %q): %w", source, cfg.Master, err)
	}
	restCfg.QPS = float32(cfg.KubeAPIQPS)
	restCfg.Burst = cfg.KubeAPIBurst
	restCfg.ContentType = "application/vnd.kubernetes.protobuf"
	restCfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	restCfg.UserAgent = "csi-provisioner/" + version
	return restCfg, nil
}

// eventCorrelatorCacheSize bounds the event correlator's caches (client-go's
// default is 4096 entries in each of three caches). Our events are already
// reduced to one per cause and object by internal/events, so the
// correlator has little left to aggregate; at 4096 its caches held about
// 3 MB for nothing.
const eventCorrelatorCacheSize = 512

// eventCorrelatorOptions are those of newBroadcaster's correlator. Its spam
// filter counts each cause (reason and message) of an object apart, not
// all of an object's events together as client-go's default does: the
// events.Deduplicator in front of it already drops repetitions, and with
// the default, a cause that flipped back and forth 25 times left the
// filter dropping the current cause, which the deduplicator, taking it
// for posted, would not post again for events.RefreshInterval.
func eventCorrelatorOptions() record.CorrelatorOptions {
	return record.CorrelatorOptions{LRUCacheSize: eventCorrelatorCacheSize, SpamKeyFunc: func(e *corev1.Event) string {
		return strings.Join([]string{e.Source.Component, e.Source.Host, string(e.InvolvedObject.UID), e.InvolvedObject.Kind,
			e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Type, e.Reason, e.Message}, "\x00")
	}}
}

// newBroadcaster returns the event broadcaster of the provisioner and the
// binder (the provisioning library has its own). Its writes to client's
// events are queued on the events.Writer of eventSplitClient; its Shutdown
// returns once what was recorded before is queued there (see
// flushingBroadcaster). Each event is also logged (see logEvent).
func newBroadcaster(ctx context.Context, client kubernetes.Interface) record.EventBroadcaster {
	b := record.NewBroadcaster(record.WithContext(ctx), record.WithCorrelatorOptions(eventCorrelatorOptions()))
	logger := klog.FromContext(ctx)
	b.StartEventWatcher(func(e *corev1.Event) { logEvent(logger, e) })
	sink := &markerSink{EventSink: &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}}
	b.StartRecordingToSink(sink)
	return &flushingBroadcaster{EventBroadcaster: b, sink: sink, logger: klog.FromContext(ctx)}
}

// logEvent logs an event of the sidecar's own recorders with the line
// client-go's structured event logging writes ("Event occurred"): a
// Warning at level 0, as the provisioning library logs its own events,
// because for a claim Pending for a cause only this sidecar reports (a
// missing StorageClass, a spec.volumeName naming no volume) it is the log's
// only account; the recorders drop a repeated cause (newRecorder), so that
// is one line per cause and object. A Normal event at level 2.
func logEvent(logger klog.Logger, e *corev1.Event) {
	v := 2
	if e.Type == corev1.EventTypeWarning {
		v = 0
	}
	logger.V(v).Info("Event occurred", "object", klog.KRef(e.InvolvedObject.Namespace, e.InvolvedObject.Name),
		"kind", e.InvolvedObject.Kind, "type", e.Type, "reason", e.Reason, "message", e.Message)
}

// newRecorder returns a recorder for component on b that drops a repeated
// cause for the same object, and learns from unwritten which of its events
// were never written.
func newRecorder(b record.EventBroadcaster, component string, unwritten *unwrittenEvents) *events.Deduplicator {
	d := events.NewDeduplicator(b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component}), 0)
	unwritten.add(d)
	return d
}

// runWithLeaderElection runs run while this process holds the Lease named
// after the driver (upstream's name, through csi-lib-utils). The identity is
// the host name plus a unique suffix, so that two replicas on one host (or
// a restarted process) never mistake each other's lease for their own.
// Losing the lease ends the process, as upstream; the election's Lease
// calls (on leClient) also go to leaseFence, the fence of the other
// clients, which ends it at once when a paused leader resumes after its
// Lease ran out (see fence).
//
// When ctx ends (SIGTERM), the leader stops run's controllers, runs finish
// (the queued events are written) and only then ends the election, which
// releases the Lease with ReleaseLeaderElectionOnExit; a process that does
// not lead ends it at once. csi-lib-utils then exits the process with
// status 1, as upstream's does: this function returns only on an error.
func runWithLeaderElection(ctx context.Context, cfg *Config, leClient kubernetes.Interface, leaseFence *fence, driverName string, srv *httpServer, run func(context.Context), finish func()) error {
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("leader election identity: %w", err)
	}
	// The election's own context ends after the leader's work, not with ctx.
	electionCtx, endElection := context.WithCancel(context.WithoutCancel(ctx))
	defer endElection()
	var mu sync.Mutex
	leading := false
	stopWatch := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !leading {
			endElection()
		}
	})
	defer stopWatch()
	// The Lease's namespace and name, computed here and handed to
	// csi-lib-utils (which would compute the same: its sanitizing is
	// idempotent), so that the Lease reportStandby reads is the one the
	// election uses.
	namespace, name := leaseNamespace(cfg.LeaderElectionNamespace), leaseName(driverName)
	// Until it leads, the process says at level 0 who does.
	becameLeader := make(chan struct{})
	// The standby's reads use leClient, not the election's fenced client:
	// one answered before this process's own acquisition but seen after
	// it would name the old holder, and the fence would end the new leader.
	go reportStandby(ctx, leClient.CoordinationV1().Leases(namespace), namespace, name, becameLeader,
		cfg.LeaderElectionLeaseDuration, standbyCheckEvery, standbyLogEvery)
	lead := func(leaderCtx context.Context) {
		mu.Lock()
		leading = true
		mu.Unlock()
		close(becameLeader)
		runCtx, cancel := context.WithCancel(leaderCtx)
		defer cancel()
		stopRun := context.AfterFunc(ctx, cancel)
		defer stopRun()
		run(runCtx)
		if ctx.Err() != nil {
			klog.FromContext(ctx).Info("Stopped")
			finish()
			endElection()
		}
	}
	le := leaderelection.NewLeaderElection(electionClient{Interface: leClient, fence: leaseFence}, name, lead)
	le.WithIdentity(host + "_" + string(uuid.NewUUID()))
	if srv.election != nil {
		le.PrepareHealthCheck(srv.election, leaderelection.DefaultHealthCheckTimeout)
	}
	le.WithNamespace(namespace)
	if len(cfg.LeaderElectionLabels) > 0 {
		le.WithLabels(cfg.LeaderElectionLabels)
	}
	le.WithLeaseDuration(cfg.LeaderElectionLeaseDuration)
	le.WithRenewDeadline(cfg.LeaderElectionRenewDeadline)
	le.WithRetryPeriod(cfg.LeaderElectionRetryPeriod)
	le.WithContext(electionCtx)
	if cfg.FeatureGates.Enabled(FeatureReleaseLeaderElectionOnExit) {
		le.WithReleaseOnCancel(true)
	}
	if err := le.Run(); err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	return nil
}

// driverOptions returns the driver client's options that depend on leader
// election: with a Lease fence, CreateVolume and DeleteVolume are gated on
// it (a leader paused past its Lease must not send a create or delete its
// fenced API writes could never record).
func driverOptions(leaseFence *fence) []csiclient.Option {
	if leaseFence == nil {
		return nil
	}
	return []csiclient.Option{csiclient.WithChangeGate(leaseFence.allow)}
}
