package capacity

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

const (
	// Labels of every published object; the informer selects on both.
	driverNameLabel = "csi.storage.k8s.io/drivername"
	managedByLabel  = "csi.storage.k8s.io/managed-by"
	managedBy       = "external-provisioner"

	generateName = "csisc-"
	queueName    = "csistoragecapacity"
	fieldManager = "csi-provisioner-capacity"
	indexByItem  = "capacityItem"

	defaultPollInterval = time.Minute
	defaultRetryStart   = time.Second
	defaultRetryMax     = 5 * time.Minute
)

// Driver is the one CSI call the controller needs; *csiclient.Client
// satisfies it.
//
// GetCapacity receives the class's parameters and one segment as accessible
// topology (none for the empty segment), never volume capabilities. It is
// called concurrently (once per busy worker), must honour ctx and should
// bound its own duration (the controller adds no timeout). An error means
// "capacity unknown": the published object is left unchanged and the item
// is retried with backoff.
// A response's available capacity is published as is, zero included; its
// maximum volume size, when set, too.
type Driver interface {
	GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error)
}

// Option configures a [Controller].
type Option func(*config)

type config struct {
	// node and nodeSegment are set in node deployment (see
	// [WithNodeDeployment]).
	node         string
	nodeSegment  segment
	owner        *metav1.OwnerReference
	pollInterval time.Duration
	immediate    bool
	retryStart   time.Duration
	retryMax     time.Duration
	registry     metrics.KubeRegistry
}

func defaultConfig() config {
	return config{pollInterval: defaultPollInterval, retryStart: defaultRetryStart, retryMax: defaultRetryMax}
}

func (c *config) validate() error {
	var errs []error
	if c.pollInterval <= 0 {
		errs = append(errs, fmt.Errorf("poll interval must be positive, got %v", c.pollInterval))
	}
	if c.retryStart <= 0 || c.retryMax < c.retryStart {
		errs = append(errs, fmt.Errorf("retry backoff must satisfy 0 < start <= max, got start %v, max %v", c.retryStart, c.retryMax))
	}
	if c.owner != nil && (c.owner.Name == "" || c.owner.UID == "" || c.owner.Kind == "" || c.owner.APIVersion == "") {
		errs = append(errs, errors.New("owner reference needs apiVersion, kind, name and uid"))
	}
	return errors.Join(errs...)
}

// WithOwner sets the owner reference of every published object (see
// [LookupOwner]); existing objects without it get it added. nil, the
// default, adds none and leaves existing references alone.
func WithOwner(ref *metav1.OwnerReference) Option { return func(c *config) { c.owner = ref } }

// WithPollInterval sets how often GetCapacity is called again for every
// desired object (default one minute).
func WithPollInterval(d time.Duration) Option { return func(c *config) { c.pollInterval = d } }

// WithImmediateBinding also publishes capacity for classes with Immediate
// binding (default: WaitForFirstConsumer classes only).
func WithImmediateBinding(on bool) Option { return func(c *config) { c.immediate = on } }

// WithRetry sets the per-key exponential backoff of failed syncs (default 1s
// doubling up to 5m).
func WithRetry(start, maxDelay time.Duration) Option {
	return func(c *config) { c.retryStart, c.retryMax = start, maxDelay }
}

// WithNodeDeployment makes the controller publish the capacity of one node
// only, for distributed provisioning (upstream's --node-deployment), where
// a sidecar runs next to the driver on every node: the one segment is
// topology (the driver's NodeGetInfo; empty for a driver without topology)
// instead of the segments of every CSINode, and the objects' managed-by
// label is "external-provisioner-<node>", so that each node's sidecar sees
// and manages only its own objects.
func WithNodeDeployment(node string, topology map[string]string) Option {
	return func(c *config) {
		c.node, c.nodeSegment = node, segment{}
		maps.Copy(c.nodeSegment, topology)
	}
}

// WithMetricsRegistry registers the controller's gauges in r. Without it
// they are not registered anywhere.
func WithMetricsRegistry(r metrics.KubeRegistry) Option { return func(c *config) { c.registry = r } }

// Controller publishes CSIStorageCapacity objects for one driver. Create it
// with [New], start the shared informer factory, then call [Controller.Run].
type Controller struct {
	client     kubernetes.Interface
	driver     Driver
	driverName string
	namespace  string
	cfg        config
	// managedBy is the value of the managed-by label of the objects.
	managedBy string

	classLister   storagelisters.StorageClassLister
	nodeLister    corelisters.NodeLister
	csiNodeLister storagelisters.CSINodeLister

	// The CSIStorageCapacity informer comes from a factory of its own,
	// restricted to namespace and to the two labels; Run starts it.
	objFactory  informers.SharedInformerFactory
	objInformer cache.SharedIndexInformer
	objLister   storagelisters.CSIStorageCapacityNamespaceLister
	synced      []cache.InformerSynced

	queue workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// started is set once the caches have synced and desired is first
	// computed; event handlers do nothing before (the first computation
	// covers what they would do).
	started bool
	logger  klog.Logger
	// desired maps item keys to the items to publish.
	desired map[string]item
	// written holds, by item key, the object as this controller last
	// created or updated it, until the informer delivers that version: so
	// that no second object is created for the item meanwhile, and the
	// next sync compares GetCapacity's answer with what was written, not
	// with an older cached copy. An entry is dropped when the informer
	// delivers the object with the written resourceVersion or deletes it,
	// and when a write of it conflicts or finds it gone.
	written map[string]*storagev1.CSIStorageCapacity
	// writing holds the keys of the items whose Create or Update is under
	// way, each with the names of that item's objects deleted meanwhile:
	// the informer can deliver a written object and its deletion before
	// the write returns, and the object must then not be recorded.
	writing map[string][]string
	// polled holds the records in written at the last poll.
	polled map[string]*storagev1.CSIStorageCapacity
}

// New creates a controller publishing the capacity of driver (named
// driverName) in namespace, writing through client. It takes the
// StorageClass, Node, CSINode, PersistentVolume and PersistentVolumeClaim
// informers from factory
// and registers its handlers on them, so factory must be started after New.
// It fails on missing arguments, invalid options, or when the metrics cannot
// be registered.
func New(client kubernetes.Interface, driver Driver, driverName, namespace string, factory informers.SharedInformerFactory, opts ...Option) (*Controller, error) {
	if client == nil || driver == nil || factory == nil {
		return nil, errors.New("new capacity controller: client, driver and informer factory are required")
	}
	if driverName == "" || namespace == "" {
		return nil, errors.New("new capacity controller: driver name and namespace are required")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("new capacity controller: %w", err)
	}

	c := &Controller{
		client:     client,
		driver:     driver,
		driverName: driverName,
		namespace:  namespace,
		cfg:        cfg,
		managedBy:  managedByValue(cfg.node),
		logger:     klog.Background(),
		written:    map[string]*storagev1.CSIStorageCapacity{},
		writing:    map[string][]string{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](cfg.retryStart, cfg.retryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: queueName}),
	}

	selector := labels.SelectorFromSet(labels.Set{driverNameLabel: driverName, managedByLabel: c.managedBy}).String()
	c.objFactory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	objects := c.objFactory.Storage().V1().CSIStorageCapacities()
	c.objInformer = objects.Informer()
	c.objLister = objects.Lister().CSIStorageCapacities(namespace)
	if err := c.objInformer.AddIndexers(cache.Indexers{indexByItem: indexObjectByItem}); err != nil {
		return nil, fmt.Errorf("new capacity controller: add indexer: %w", err)
	}

	classes := factory.Storage().V1().StorageClasses()
	volumes := factory.Core().V1().PersistentVolumes()
	claims := factory.Core().V1().PersistentVolumeClaims()
	c.classLister = classes.Lister()

	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{c.objInformer, cache.ResourceEventHandlerFuncs{AddFunc: c.onObject, UpdateFunc: func(_, obj any) { c.onObject(obj) }, DeleteFunc: c.onObjectDelete}},
		{classes.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onTopologyChange, UpdateFunc: c.onClassUpdate, DeleteFunc: c.onTopologyChange}},
		{volumes.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onVolume, UpdateFunc: c.onVolumeUpdate, DeleteFunc: c.onVolumeDelete}},
		{claims.Informer(), cache.ResourceEventHandlerFuncs{UpdateFunc: c.onClaimUpdate}},
	}
	if cfg.node == "" {
		// The segments of every node: watch Nodes and CSINodes. In node
		// deployment the one segment is fixed.
		nodes := factory.Core().V1().Nodes()
		csiNodes := factory.Storage().V1().CSINodes()
		c.nodeLister, c.csiNodeLister = nodes.Lister(), csiNodes.Lister()
		handlers = append(handlers, []struct {
			informer cache.SharedIndexInformer
			handler  cache.ResourceEventHandler
		}{
			{nodes.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onTopologyChange, UpdateFunc: c.onNodeUpdate, DeleteFunc: c.onTopologyChange}},
			{csiNodes.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onTopologyChange, UpdateFunc: c.onCSINodeUpdate, DeleteFunc: c.onTopologyChange}},
		}...)
	}
	for _, h := range handlers {
		reg, err := h.informer.AddEventHandler(h.handler)
		if err != nil {
			return nil, fmt.Errorf("new capacity controller: add event handler: %w", err)
		}
		c.synced = append(c.synced, reg.HasSynced)
	}

	if cfg.registry != nil {
		if err := cfg.registry.CustomRegister(&collector{c: c}); err != nil {
			return nil, fmt.Errorf("new capacity controller: register metrics: %w", err)
		}
	}
	return c, nil
}

// managedByValue is the managed-by label of the objects: upstream's
// "external-provisioner", or in node deployment "external-provisioner-<node>"
// shortened exactly as upstream shortens it (its getNameWithMaxLength), so
// that each of the two finds the other's objects after a switch: a label
// value has at most 63 characters, so a longer value keeps the node name
// whole behind the start of "external-provisioner" and that name's hash;
// for a node name too long for that, the value is "external-provisioner-"
// and a hash of the full value.
func managedByValue(node string) string {
	if node == "" {
		return managedBy
	}
	v := managedBy + "-" + node
	const maxLen = validation.LabelValueMaxLength
	if len(v) <= maxLen {
		return v
	}
	if keep := maxLen - len("-01234567-") - len(node); keep > 0 {
		return managedBy[:keep] + "-" + fnvHex(managedBy) + "-" + node
	}
	short := managedBy + "-" + fnvHex(v)
	return short[:min(maxLen, len(short))]
}

// fnvHex is the 32-bit FNV-1a hash of s in 8 hexadecimal digits.
func fnvHex(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%08x", h.Sum32())
}

// indexObjectByItem indexes CSIStorageCapacity objects by the key of the
// item they are for.
func indexObjectByItem(obj any) ([]string, error) {
	csc, ok := obj.(*storagev1.CSIStorageCapacity)
	if !ok {
		return nil, nil
	}
	if key, ok := itemKeyOf(csc); ok {
		return []string{key}, nil
	}
	return nil, nil
}

// HasSynced reports whether all informers have synced and the desired
// objects have been computed once.
func (c *Controller) HasSynced() bool {
	if !c.informersSynced() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started
}

func (c *Controller) informersSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Run starts the CSIStorageCapacity informer, waits for all informers to
// sync, then runs workers workers (at least one) and the periodic refresh
// until ctx is done. It returns after all of them and the informer have
// stopped. It must be called once.
func (c *Controller) Run(ctx context.Context, workers int) {
	logger := klog.FromContext(ctx).WithName("capacity")
	ctx = klog.NewContext(ctx, logger)
	workers = max(workers, 1)
	defer c.queue.ShutDown()

	c.objFactory.Start(ctx.Done())
	// Shutdown waits for the informer goroutines, which stop with ctx.
	defer c.objFactory.Shutdown()

	logger.Info("Starting CSIStorageCapacity controller", "driver", c.driverName, "namespace", c.namespace,
		"workers", workers, "pollInterval", c.cfg.pollInterval, "immediateBinding", c.cfg.immediate)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.informersSynced) {
		return
	}
	c.start(ctx)

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	wg.Go(func() { c.pollLoop(ctx) })

	<-ctx.Done()
	logger.Info("Stopping CSIStorageCapacity controller")
	c.queue.ShutDown()
	wg.Wait()
}

// start computes the desired objects for the first time and queues them and
// every obsolete object.
func (c *Controller) start(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.logger = klog.FromContext(ctx)
	c.started = true
	c.refreshLocked()
	c.queueObsoleteLocked()
}

// pollLoop queues every desired item, and every obsolete object, each poll
// interval until ctx is done.
func (c *Controller) pollLoop(ctx context.Context) {
	ticker := time.NewTicker(c.cfg.pollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			c.queueAll()
		}
	}
}

func (c *Controller) queueAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A record the informer has not delivered for a whole poll interval
	// stands for a version it will never deliver (the object went while
	// its watch was broken): drop it, so that the cache decides again.
	for key, r := range c.written {
		if c.polled[key] == r {
			delete(c.written, key)
			delete(c.polled, key)
		}
	}
	c.polled = maps.Clone(c.written)
	c.refreshLocked()
	for key := range c.desired {
		c.queue.Add(key)
	}
	c.queueObsoleteLocked()
}

// processNext syncs one key; it returns false when the queue shut down.
func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	c.handleResult(ctx, key, c.sync(ctx, key))
	return true
}

// handleResult is the one place that turns a sync's result into queue
// operations: an error requeues the key with backoff, success forgets it.
func (c *Controller) handleResult(ctx context.Context, key string, err error) {
	if err == nil {
		c.queue.Forget(key)
		return
	}
	logger := klog.FromContext(ctx)
	if apierrors.IsConflict(err) {
		// The informer delivers the newer version; the retry uses it.
		logger.V(2).Info("CSIStorageCapacity changed meanwhile; retrying", "key", key, "err", err)
	} else {
		logger.Error(err, "CSIStorageCapacity sync failed; retrying", "key", key)
	}
	c.queue.AddRateLimited(key)
}

// sync dispatches key to the sync function of its kind.
func (c *Controller) sync(ctx context.Context, key string) error {
	if name, ok := strings.CutPrefix(key, objectKeyPrefix); ok {
		return c.syncObject(ctx, name)
	}
	if strings.HasPrefix(key, itemKeyPrefix) {
		return c.syncItem(ctx, key)
	}
	klog.FromContext(ctx).Error(nil, "Unknown queue key; dropped", "key", key)
	return nil
}

// syncItem brings the object of the item with key up to date: it deletes
// all but the oldest of the objects for the item, calls GetCapacity, and
// creates the object, or updates it when capacity, maximum volume size or
// owner differ. A GetCapacity error leaves the object as it is. Nothing
// happens for an item that is no longer desired (its objects are queued as
// obsolete when it goes). It is idempotent.
func (c *Controller) syncItem(ctx context.Context, key string) error {
	c.mu.Lock()
	it, ok := c.desired[key]
	// Read the record before the cache: the record is dropped only after
	// the cache has the object, so one of the two has it.
	record := c.written[key]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("storageClass", it.class, "segment", it.segment.String())

	class, err := c.classLister.Get(it.class)
	if apierrors.IsNotFound(err) {
		return nil // the class handler removes the item
	}
	if err != nil {
		return fmt.Errorf("get storage class %s: %w", it.class, err)
	}

	objs := c.objectsFor(key, record)
	var current *storagev1.CSIStorageCapacity
	if len(objs) > 0 {
		current = objs[0]
	}
	for _, dup := range objs[min(1, len(objs)):] {
		logger.V(2).Info("Deleting duplicate CSIStorageCapacity", "csiStorageCapacity", klog.KObj(dup), "kept", klog.KObj(current))
		if err := c.deleteObject(ctx, dup); err != nil {
			return err
		}
		c.forgetWritten(key, dup.Name)
	}

	req := &csi.GetCapacityRequest{Parameters: csiclient.DriverParameters(class.Parameters)}
	if len(it.segment) > 0 {
		// The empty segment (no topology keys) covers every node: the
		// request asks for all the storage. The CSI spec forbids
		// accessible_topology unless the plugin has
		// VOLUME_ACCESSIBILITY_CONSTRAINTS, which a driver without
		// topology keys typically lacks.
		req.AccessibleTopology = &csi.Topology{Segments: maps.Clone(it.segment)}
	}
	resp, err := c.driver.GetCapacity(ctx, req)
	if err != nil {
		return fmt.Errorf("get capacity for storage class %s and segment %s: %w", it.class, it.segment, err)
	}
	capacity := resource.NewQuantity(resp.GetAvailableCapacity(), resource.BinarySI)
	var maxSize *resource.Quantity
	if resp.GetMaximumVolumeSize() != nil {
		maxSize = resource.NewQuantity(resp.GetMaximumVolumeSize().GetValue(), resource.BinarySI)
	}

	if current == nil {
		obj := c.newObject(it, capacity, maxSize)
		created, recorded, err := c.write(key, func() (*storagev1.CSIStorageCapacity, error) {
			return c.client.StorageV1().CSIStorageCapacities(c.namespace).Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager})
		})
		if err != nil {
			return fmt.Errorf("create CSIStorageCapacity for storage class %s and segment %s: %w", it.class, it.segment, err)
		}
		if !recorded {
			return fmt.Errorf("CSIStorageCapacity %s/%s was deleted right after it was created; creating it again", created.Namespace, created.Name)
		}
		logger.V(2).Info("Created CSIStorageCapacity", "csiStorageCapacity", klog.KObj(created), "capacity", capacity, "maximumVolumeSize", maxSize)
		return nil
	}

	if quantityEqual(current.Capacity, capacity) && quantityEqual(current.MaximumVolumeSize, maxSize) && c.hasOwner(current) {
		logger.V(5).Info("CSIStorageCapacity is up to date", "csiStorageCapacity", klog.KObj(current))
		return nil
	}
	obj := current.DeepCopy()
	obj.Capacity, obj.MaximumVolumeSize = capacity, maxSize
	if !c.hasOwner(obj) {
		// Ours replaces another controller reference (an earlier
		// ReplicaSet of the Deployment, say): an object may have only one,
		// and the API server refuses a second. Upstream appends, and then
		// never updates the object again.
		obj.OwnerReferences = slices.DeleteFunc(obj.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Controller != nil && *r.Controller
		})
		obj.OwnerReferences = append(obj.OwnerReferences, *c.cfg.owner)
	}
	updated, recorded, err := c.write(key, func() (*storagev1.CSIStorageCapacity, error) {
		return c.client.StorageV1().CSIStorageCapacities(c.namespace).Update(ctx, obj, metav1.UpdateOptions{FieldManager: fieldManager})
	})
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			// Deleted by someone else (the retry creates it again), or
			// changed since it was written or cached: the retry starts
			// from the informer's copy.
			c.forgetWritten(key, obj.Name)
		}
		return fmt.Errorf("update CSIStorageCapacity %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	if !recorded {
		return fmt.Errorf("CSIStorageCapacity %s/%s was deleted right after it was updated; creating it again", updated.Namespace, updated.Name)
	}
	logger.V(2).Info("Updated CSIStorageCapacity", "csiStorageCapacity", klog.KObj(updated), "capacity", capacity, "maximumVolumeSize", maxSize)
	return nil
}

// syncObject deletes the object named name when it is for no desired item.
// Nothing happens when it is gone or desired.
func (c *Controller) syncObject(ctx context.Context, name string) error {
	obj, err := c.objLister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get CSIStorageCapacity %s/%s: %w", c.namespace, name, err)
	}
	key, ok := itemKeyOf(obj)
	c.mu.Lock()
	_, desired := c.desired[key]
	c.mu.Unlock()
	if ok && desired {
		return nil
	}
	klog.FromContext(ctx).V(2).Info("Deleting obsolete CSIStorageCapacity", "csiStorageCapacity", klog.KObj(obj), "storageClass", obj.StorageClassName)
	return c.deleteObject(ctx, obj)
}

// objectsFor returns the objects for the item with key, from the cache with
// record (the object as last written, see written) in place of its cached
// copy or added when not cached yet, oldest first.
func (c *Controller) objectsFor(key string, record *storagev1.CSIStorageCapacity) []*storagev1.CSIStorageCapacity {
	var objs []*storagev1.CSIStorageCapacity
	cached, _ := c.objInformer.GetIndexer().ByIndex(indexByItem, key)
	for _, o := range cached {
		if obj, ok := o.(*storagev1.CSIStorageCapacity); ok && (record == nil || obj.Name != record.Name) {
			objs = append(objs, obj)
		}
	}
	if record != nil {
		objs = append(objs, record)
	}
	slices.SortFunc(objs, func(a, b *storagev1.CSIStorageCapacity) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return objs
}

// newObject returns the object to create for it.
func (c *Controller) newObject(it item, capacity, maxSize *resource.Quantity) *storagev1.CSIStorageCapacity {
	// The empty segment (a driver without topology) selects every node.
	topology := &metav1.LabelSelector{}
	if len(it.segment) > 0 {
		topology.MatchLabels = maps.Clone(it.segment)
	}
	obj := &storagev1.CSIStorageCapacity{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: generateName,
			Namespace:    c.namespace,
			Labels:       map[string]string{driverNameLabel: c.driverName, managedByLabel: c.managedBy},
		},
		StorageClassName:  it.class,
		NodeTopology:      topology,
		Capacity:          capacity,
		MaximumVolumeSize: maxSize,
	}
	if c.cfg.owner != nil {
		obj.OwnerReferences = []metav1.OwnerReference{*c.cfg.owner}
	}
	return obj
}

// hasOwner reports whether obj has the configured owner, or no owner is
// configured.
func (c *Controller) hasOwner(obj *storagev1.CSIStorageCapacity) bool {
	owner := c.cfg.owner
	return owner == nil || slices.ContainsFunc(obj.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == owner.UID })
}

func quantityEqual(a, b *resource.Quantity) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Cmp(*b) == 0
}

// deleteObject deletes obj, provided it still has the same UID. An object
// that is already gone is no error.
func (c *Controller) deleteObject(ctx context.Context, obj *storagev1.CSIStorageCapacity) error {
	opts := metav1.DeleteOptions{}
	if obj.UID != "" {
		opts.Preconditions = metav1.NewUIDPreconditions(string(obj.UID))
	}
	err := c.client.StorageV1().CSIStorageCapacities(obj.Namespace).Delete(ctx, obj.Name, opts)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete CSIStorageCapacity %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	return nil
}

// write runs write, a Create or an Update of an object of the item with
// key, and records the object it returns (see written), unless the
// informer delivered that object's deletion before write returned:
// recorded is false then, and the object must be written again.
func (c *Controller) write(key string, write func() (*storagev1.CSIStorageCapacity, error)) (obj *storagev1.CSIStorageCapacity, recorded bool, err error) {
	c.mu.Lock()
	c.writing[key] = nil
	c.mu.Unlock()
	obj, err = write()
	c.mu.Lock()
	defer c.mu.Unlock()
	deleted := c.writing[key]
	delete(c.writing, key)
	if err != nil || slices.Contains(deleted, obj.Name) {
		return obj, false, err
	}
	c.rememberWrittenLocked(key, obj)
	return obj, true, nil
}

// rememberWrittenLocked records obj, just written, for the item with key,
// unless the informer already has that version.
func (c *Controller) rememberWrittenLocked(key string, obj *storagev1.CSIStorageCapacity) {
	if cached, err := c.objLister.Get(obj.Name); err == nil && cached.ResourceVersion == obj.ResourceVersion {
		c.forgetWrittenLocked(key, obj.Name)
		return
	}
	c.written[key] = obj
}

// forgetWritten drops the record of the item with key if it is the object
// named name.
func (c *Controller) forgetWritten(key, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetWrittenLocked(key, name)
}

func (c *Controller) forgetWrittenLocked(key, name string) {
	if r := c.written[key]; r != nil && r.Name == name {
		delete(c.written, key)
	}
}

// deliveredLocked drops the record of the item with key when the informer
// delivered the written version of it.
func (c *Controller) deliveredLocked(key string, obj *storagev1.CSIStorageCapacity) {
	if r := c.written[key]; r != nil && r.Name == obj.Name && r.ResourceVersion == obj.ResourceVersion {
		delete(c.written, key)
	}
}

// refreshLocked computes the desired items from the caches, queues the new
// ones and the objects of those that are gone.
func (c *Controller) refreshLocked() {
	segments := map[string]segment{c.cfg.nodeSegment.String(): c.cfg.nodeSegment}
	if c.cfg.node == "" {
		csiNodes, err := c.csiNodeLister.List(labels.Everything())
		if err != nil {
			c.logger.Error(err, "Cannot list CSINodes; desired CSIStorageCapacity objects unchanged")
			return
		}
		segments = nodeSegments(c.logger, c.driverName, csiNodes, c.nodeLister)
	}
	classes, err := c.classLister.List(labels.Everything())
	if err != nil {
		c.logger.Error(err, "Cannot list StorageClasses; desired CSIStorageCapacity objects unchanged")
		return
	}
	items := desiredItems(classes, segments, c.driverName, c.cfg.immediate)
	var added, removed int
	for key := range items {
		if _, ok := c.desired[key]; !ok {
			c.queue.Add(key)
			added++
		}
	}
	for key := range c.desired {
		if _, ok := items[key]; ok {
			continue
		}
		removed++
		objs, _ := c.objInformer.GetIndexer().ByIndex(indexByItem, key)
		for _, o := range objs {
			if obj, ok := o.(*storagev1.CSIStorageCapacity); ok {
				c.queue.Add(objectKey(obj.Name))
			}
		}
	}
	c.desired = items
	if added+removed > 0 {
		c.logger.V(2).Info("Desired CSIStorageCapacity objects changed", "added", added, "removed", removed,
			"total", len(items), "segments", len(segments))
	}
}

// queueObsoleteLocked queues every cached object that is for no desired
// item.
func (c *Controller) queueObsoleteLocked() {
	for _, obj := range c.obsoleteLocked() {
		c.queue.Add(objectKey(obj.Name))
	}
}

// obsoleteLocked returns the cached objects that are for no desired item.
func (c *Controller) obsoleteLocked() []*storagev1.CSIStorageCapacity {
	var out []*storagev1.CSIStorageCapacity
	for _, o := range c.objInformer.GetStore().List() {
		obj, ok := o.(*storagev1.CSIStorageCapacity)
		if !ok {
			continue
		}
		if key, ok := itemKeyOf(obj); !ok || !c.isDesiredLocked(key) {
			out = append(out, obj)
		}
	}
	return out
}

func (c *Controller) isDesiredLocked(key string) bool {
	_, ok := c.desired[key]
	return ok
}

// counts returns the values of the gauges: desired items, desired items with
// an object, and obsolete objects.
func (c *Controller) counts() (goal, current, obsolete int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	goal = len(c.desired)
	for key := range c.desired {
		objs, _ := c.objInformer.GetIndexer().ByIndex(indexByItem, key)
		if len(objs) > 0 || c.written[key] != nil {
			current++
		}
	}
	return goal, current, len(c.obsoleteLocked())
}
