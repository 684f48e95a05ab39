package binder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/volindex"
)

// Binder binds the claims and volumes of one CSI driver and moves released
// volumes on to reclaim. Create it with [New], then start the informer
// factory, then call [Binder.Run].
type Binder struct {
	client kubernetes.Interface
	driver string
	cfg    config

	recorder    *events.Deduplicator
	broadcaster record.EventBroadcaster // nil when the caller gave a recorder

	pvInformer  cache.SharedIndexInformer
	pvcInformer cache.SharedIndexInformer
	pvLister    corelisters.PersistentVolumeLister
	pvcLister   corelisters.PersistentVolumeClaimLister
	scLister    storagelisters.StorageClassLister
	podIndexer  cache.Indexer
	volumes     *volindex.Index
	synced      []cache.InformerSynced

	claimQueue  workqueue.TypedRateLimitingInterface[string]
	volumeQueue workqueue.TypedRateLimitingInterface[string]

	// Own writes not yet seen by the informers; see writeCache.
	pvs    *writeCache[*corev1.PersistentVolume]
	claims *writeCache[*corev1.PersistentVolumeClaim]

	// reserveMu is held while a claim is matched to a volume that is not yet
	// reserved for it and while that reservation (the volume's claimRef) is
	// written and cached. See the package documentation.
	reserveMu sync.Mutex

	metrics *binderMetrics

	// lost remembers deleted volumes for the claims in scope only
	// through them; see lostVolumes.
	lost *lostVolumes

	// gone remembers claims not in the cache for the volumes named after
	// them; see newGoneClaims.
	gone *goneClaims

	// unusedTracked is set once a claim with the Unused condition was seen:
	// the cluster maintains it (see unused.go).
	unusedTracked atomic.Bool
}

// New registers event handlers and indexers on factory's PV, PVC,
// StorageClass and Pod informers; the caller starts the factory after
// constructing all components. driverName is the CSI driver whose claims and
// volumes the binder handles. New fails on an invalid option or when an
// informer was already started.
func New(client kubernetes.Interface, driverName string, factory informers.SharedInformerFactory, opts ...Option) (*Binder, error) {
	if client == nil || factory == nil {
		return nil, errors.New("new binder: client and informer factory are required")
	}
	if driverName == "" {
		return nil, errors.New("new binder: driver name is required")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new binder: %w", err)
	}

	b := &Binder{
		client:  client,
		driver:  driverName,
		cfg:     cfg,
		pvs:     newWriteCache[*corev1.PersistentVolume](),
		claims:  newWriteCache[*corev1.PersistentVolumeClaim](),
		metrics: newMetrics(),
		lost:    newLostVolumes(cfg.clock),
		gone:    newGoneClaims(cfg.clock),
	}

	switch r := cfg.recorder.(type) {
	case *events.Deduplicator:
		b.recorder = r
	case nil:
		b.broadcaster = record.NewBroadcaster()
		b.recorder = events.NewDeduplicator(
			b.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventSourceComponent}), 0, events.WithNow(cfg.clock.Now))
	default:
		b.recorder = events.NewDeduplicator(r, 0, events.WithNow(cfg.clock.Now))
	}

	newQueue := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryBaseDelay, retryMaxDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name, Clock: cfg.clock})
	}
	b.claimQueue = newQueue("binder_claims")
	b.volumeQueue = newQueue("binder_volumes")

	pvs := factory.Core().V1().PersistentVolumes()
	pvcs := factory.Core().V1().PersistentVolumeClaims()
	scs := factory.Storage().V1().StorageClasses()
	pods := factory.Core().V1().Pods()
	b.pvInformer, b.pvcInformer = pvs.Informer(), pvcs.Informer()
	b.pvLister, b.pvcLister, b.scLister = pvs.Lister(), pvcs.Lister(), scs.Lister()
	b.podIndexer = pods.Informer().GetIndexer()

	if err := b.pvInformer.AddIndexers(cache.Indexers{indexUnboundByClass: b.indexUnboundVolumeByClass, indexForeignUnboundByClass: b.indexForeignUnboundVolumeByClass}); err != nil {
		return nil, fmt.Errorf("new binder: add volume indexers: %w", err)
	}
	volumeIndex, err := volindex.Add(b.pvInformer, cfg.namePrefix)
	if err != nil {
		return nil, fmt.Errorf("new binder: %w", err)
	}
	b.volumes = volumeIndex
	if err := b.pvcInformer.AddIndexers(cache.Indexers{
		indexPendingByClass: indexPendingClaimByClass,
		indexClaimByVolume:  b.indexBoundClaimByVolume,
	}); err != nil {
		return nil, fmt.Errorf("new binder: add claim indexers: %w", err)
	}
	if err := pods.Informer().AddIndexers(cache.Indexers{indexPodByClaim: indexPodByClaimKey}); err != nil {
		return nil, fmt.Errorf("new binder: add pod indexers: %w", err)
	}

	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{b.pvInformer, cache.ResourceEventHandlerFuncs{AddFunc: b.onVolumeAdd, UpdateFunc: b.onVolumeUpdate, DeleteFunc: b.onVolumeDelete}},
		{b.pvcInformer, cache.ResourceEventHandlerFuncs{AddFunc: b.onClaimAdd, UpdateFunc: b.onClaimUpdate, DeleteFunc: b.onClaimDelete}},
		{scs.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: b.onClass, UpdateFunc: b.onClassUpdate, DeleteFunc: b.onClassDelete}},
		{pods.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: b.onPod, UpdateFunc: func(_, obj interface{}) { b.onPod(obj) }}},
	}
	for _, h := range handlers {
		reg, err := h.informer.AddEventHandler(h.handler)
		if err != nil {
			return nil, fmt.Errorf("new binder: add event handler: %w", err)
		}
		b.synced = append(b.synced, reg.HasSynced)
	}

	if cfg.registry != nil {
		if err := b.metrics.register(cfg.registry, b); err != nil {
			return nil, fmt.Errorf("new binder: register metrics: %w", err)
		}
	}
	return b, nil
}

// HasSynced reports whether all four informers have synced and delivered
// their initial objects to the binder's handlers.
func (b *Binder) HasSynced() bool {
	for _, s := range b.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Run waits for the informer caches, then runs the claim and volume workers
// and the periodic resync until ctx is done. It returns after all of them
// have stopped. It must be called once.
func (b *Binder) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("binder")
	ctx = klog.NewContext(ctx, logger)
	defer b.claimQueue.ShutDown()
	defer b.volumeQueue.ShutDown()

	if b.broadcaster != nil {
		b.broadcaster.StartStructuredLogging(3)
		b.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: b.client.CoreV1().Events("")})
		defer b.broadcaster.Shutdown()
	}

	logger.Info("Starting binder", "driver", b.driver, "workers", b.cfg.workers, "resyncPeriod", b.cfg.resyncPeriod)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, b.HasSynced) {
		return fmt.Errorf("run binder: wait for informer caches: %w", context.Cause(ctx))
	}

	var wg sync.WaitGroup
	for range b.cfg.workers {
		wg.Go(func() {
			for b.processNext(ctx, b.claimQueue, "pvc", b.syncClaim) {
			}
		})
		wg.Go(func() {
			for b.processNext(ctx, b.volumeQueue, "pv", b.syncVolume) {
			}
		})
	}
	wg.Go(func() { b.resyncLoop(ctx) })

	<-ctx.Done()
	logger.Info("Stopping binder")
	b.claimQueue.ShutDown()
	b.volumeQueue.ShutDown()
	wg.Wait()
	return nil
}

// result is what a sync function asks of its queue besides success or
// failure.
type result struct {
	// requeueAfter > 0 queues the key again after that long.
	requeueAfter time.Duration
}

// processNext takes one key from q and syncs it. It returns false when the
// queue is shut down.
func (b *Binder) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], kind string,
	sync func(context.Context, string) (result, error)) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	logger := klog.FromContext(ctx).WithValues(kind, key)
	ctx = klog.NewContext(ctx, logger)
	res, err := sync(ctx, key)
	b.handleResult(ctx, q, key, res, err)
	return true
}

// handleResult is the one place that turns a sync result into queue
// operations: an error is retried with per-key backoff (a conflict or a
// volume reserved by another worker is expected under concurrency and logged
// quietly), requeueAfter queues the
// key again later, success forgets the key's backoff.
func (b *Binder) handleResult(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], key string, res result, err error) {
	logger := klog.FromContext(ctx)
	switch {
	case err != nil && (apierrors.IsConflict(err) || errors.Is(err, errVolumeTaken)):
		logger.V(3).Info("Sync lost a race, will retry", "err", err)
		q.AddRateLimited(key)
	case err != nil && ctx.Err() != nil:
		// Shutting down: the write was cut short, not refused.
		logger.V(3).Info("Sync interrupted by shutdown", "err", err)
		q.AddRateLimited(key)
	case err != nil:
		logger.Error(err, "Sync failed, will retry")
		q.AddRateLimited(key)
	case res.requeueAfter > 0:
		q.Forget(key)
		q.AddAfter(key, res.requeueAfter)
	default:
		q.Forget(key)
	}
}

// resyncLoop queues, every resync period, the objects that may need work.
func (b *Binder) resyncLoop(ctx context.Context) {
	t := b.cfg.clock.NewTicker(b.cfg.resyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			b.resync(ctx)
		}
	}
}
