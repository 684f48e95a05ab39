package binder

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/utils/clock"
)

// Defaults, in one place.
const (
	// DefaultResyncPeriod is how often objects that may need work are queued
	// again, the role of kube-controller-manager's
	// --pvclaimbinder-sync-period.
	DefaultResyncPeriod = 15 * time.Second
	// DefaultWorkers is the number of workers per queue (claims and volumes).
	DefaultWorkers = 4
	// EventSourceComponent is the source component of the events the
	// binder's default recorder posts.
	EventSourceComponent = "csi-provisioner-binder"
	// FieldManager is the field manager of every write of the binder.
	FieldManager = "csi-provisioner-binder"

	// Per-key retry backoff of failed syncs. The periodic resync queues a
	// failed object again anyway while it needs work, so the effective retry
	// interval never exceeds the resync period by much.
	retryBaseDelay = 100 * time.Millisecond
	retryMaxDelay  = 5 * time.Minute
)

// ProvisionChecker is implemented by the provisioner. The binder asks it, once,
// right before it hands a claim to this driver's provisioner.
type ProvisionChecker interface {
	// CheckProvision says whether CreateVolume could be sent for claim with
	// class now (parameters, secrets, ... valid); nil means yes.
	//
	// With nil, the binder adds the in-flight finalizer (see package
	// inflight) in the same write that sets the storage-provisioner
	// annotations, so the provisioner needs no write of its own before
	// CreateVolume. With an error, the binder sets the annotations only; the
	// provisioner then reports the error on the claim. It must not write
	// anything and should return quickly: it runs on a binder worker.
	CheckProvision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) error
	// VolumeName returns the name of the volume the provisioner's
	// CreateVolume for claim uses. The binder records it with the in-flight
	// finalizer (inflight.AnnVolumeName), so that every later call, in any
	// process, uses the same name.
	VolumeName(claim *corev1.PersistentVolumeClaim) string
}

// Option configures a [Binder].
type Option func(*config)

type config struct {
	resyncPeriod time.Duration
	workers      int
	recorder     record.EventRecorder
	checker      ProvisionChecker
	registry     metrics.KubeRegistry
	clock        clock.WithTicker
	grace        time.Duration
	graceSet     bool
	namePrefix   string
	inTree       string
}

func defaultConfig() config {
	return config{
		resyncPeriod: DefaultResyncPeriod,
		workers:      DefaultWorkers,
		clock:        clock.RealClock{},
	}
}

// validate checks the configuration and fills in defaults that depend on
// other settings.
func (c *config) validate() error {
	var errs []error
	if c.resyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("resync period must be positive, got %v", c.resyncPeriod))
	}
	if c.workers < 1 {
		errs = append(errs, fmt.Errorf("workers must be at least 1, got %d", c.workers))
	}
	if c.graceSet && c.grace < 0 {
		errs = append(errs, fmt.Errorf("provisioning grace must not be negative, got %v", c.grace))
	}
	if c.clock == nil {
		errs = append(errs, errors.New("clock must not be nil"))
	}
	if !c.graceSet {
		c.grace = 2 * c.resyncPeriod
	}
	return errors.Join(errs...)
}

// WithResyncPeriod sets how often objects that may need work are queued
// again (default [DefaultResyncPeriod]).
func WithResyncPeriod(d time.Duration) Option { return func(c *config) { c.resyncPeriod = d } }

// WithWorkers sets the number of workers of each queue (default
// [DefaultWorkers]). See the package documentation for why more than one is
// safe.
func WithWorkers(n int) Option { return func(c *config) { c.workers = n } }

// WithEventRecorder sets the recorder events go to. The binder wraps it in an
// events.Deduplicator unless it already is one (so the provisioner and the
// binder can share one). Without this option the binder posts events to the
// API server with source component [EventSourceComponent].
func WithEventRecorder(r record.EventRecorder) Option { return func(c *config) { c.recorder = r } }

// WithProvisionCheck sets the check run before a claim is handed to the
// provisioner; see [ProvisionChecker]. Without it, the in-flight finalizer is
// always added with the storage-provisioner annotations.
func WithProvisionCheck(p ProvisionChecker) Option { return func(c *config) { c.checker = p } }

// WithMetricsRegistry registers the binder's metrics in r. Without it the
// metrics are not registered anywhere and cost nothing.
func WithMetricsRegistry(r metrics.KubeRegistry) Option { return func(c *config) { c.registry = r } }

// WithUIDNamedVolumes says that the volumes this driver's provisioner makes
// are named prefix + "-" + the claim's UID (see
// provisioner.Provisioner.UIDNamePrefix). Such a name already links a
// volume and its claim, so the binder's indexes keep no entry for a volume
// named after its claimRef, nor for a claim whose spec.volumeName is named
// after the claim: about 500 bytes less per bound pair. Without this
// option every pair is indexed.
func WithUIDNamedVolumes(prefix string) Option { return func(c *config) { c.namePrefix = prefix } }

// WithClock replaces the real clock (tests).
func WithClock(clk clock.WithTicker) Option { return func(c *config) { c.clock = clk } }

// WithProvisioningGrace sets how long after its creation a claim handed to
// this driver may stay unbound before the binder reports a Normal
// ExternalProvisioning event on it (default: twice the resync period).
func WithProvisioningGrace(d time.Duration) Option {
	return func(c *config) { c.grace, c.graceSet = d, true }
}

// WithInTreeMigration makes the binder also serve the StorageClasses and
// volumes of inTree, the in-tree volume plugin that migrates to this driver
// (CSI migration, for example kubernetes.io/aws-ebs for ebs.csi.aws.com),
// as kube-controller-manager's binder does for a migrated plugin: such a
// claim is handed to the driver, and the in-tree volumes of the plugin are
// bound and reclaimed like the driver's.
// The provisioner needs the same option.
func WithInTreeMigration(inTree string) Option { return func(c *config) { c.inTree = inTree } }
