package provisioner

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/kube-storage/csi-provisioner/pkg/refgrant"
)

// Defaults of the options, in one place. Each maps an upstream
// external-provisioner flag of the same meaning.
const (
	// DefaultVolumeNamePrefix is --volume-name-prefix.
	DefaultVolumeNamePrefix = "pvc"
	// DefaultVolumeNameUUIDLength is --volume-name-uuid-length: -1 keeps the
	// claim UID whole, with its dashes.
	DefaultVolumeNameUUIDLength = -1
	// DefaultImmediateTopology is --immediate-topology.
	DefaultImmediateTopology = true
	// DefaultVolumeAttributesClass is the VolumeAttributesClass feature gate.
	DefaultVolumeAttributesClass = true
	// DefaultBinderEnabled says whether this product's own binder runs. It
	// only changes when the in-flight guard removes its finalizer (see the
	// package documentation); either value is safe.
	DefaultBinderEnabled = true

	// FieldManager is the field manager of every write of the provisioner.
	FieldManager = "csi-provisioner"
	// EventSourceComponent is the source component of the events the
	// provisioner posts when it is given no recorder; upstream's name.
	EventSourceComponent = "external-provisioner"

	// maxUUIDLength is the number of hex digits of a UID without dashes.
	maxUUIDLength = 32
	// wholeUIDLength is the length of a UID with its dashes.
	wholeUIDLength = 36
)

// Option configures [New].
type Option func(*config)

type config struct {
	volumeNamePrefix          string
	volumeNameUUIDLength      int
	defaultFSType             string
	extraCreateMetadata       bool
	strictTopology            bool
	immediateTopology         bool
	topologyOff               bool
	controllerPublishReadOnly bool
	identity                  string
	identitySet               bool
	recorder                  record.EventRecorder
	binderEnabled             bool
	volumeAttributesClass     bool
	// vacUnserved says the API server does not serve storage.k8s.io/v1
	// VolumeAttributesClasses (WithVolumeAttributesClassesServed).
	vacUnserved bool
	clock       clock.Clock
	// snapshots is the snapshot API client; nil refuses restores.
	snapshots snapclient.Interface
	// snapshotInf is set by WithSnapshotInformer; nil without.
	snapshotInf                 cache.SharedIndexInformer
	preventVolumeModeConversion bool
	// node is set by WithNodeDeployment; nil for central provisioning.
	node *NodeDeployment
	// grants is set by WithReferenceGrants; nil refuses sources in other
	// namespaces.
	grants ReferenceGrants
	// inTree is the migrated in-tree plugin (WithInTreeMigration), "" for
	// none.
	inTree string
	// retryStart and retryMax bound the backoff of the provisioner's own
	// queues (WithRetryIntervals); zero for client-go's default.
	retryStart, retryMax time.Duration
}

func defaultConfig() config {
	return config{
		volumeNamePrefix:      DefaultVolumeNamePrefix,
		volumeNameUUIDLength:  DefaultVolumeNameUUIDLength,
		immediateTopology:     DefaultImmediateTopology,
		binderEnabled:         DefaultBinderEnabled,
		volumeAttributesClass: DefaultVolumeAttributesClass,
		clock:                 clock.RealClock{},

		preventVolumeModeConversion: true,
	}
}

// validate checks the options and fills in the defaults that depend on
// other settings (the identity needs the clock and the driver name).
func (c *config) validate(driverName string) error {
	var errs []error
	if c.volumeNamePrefix == "" {
		errs = append(errs, errors.New("volume name prefix must not be empty"))
	}
	if c.volumeNameUUIDLength != -1 && (c.volumeNameUUIDLength < 1 || c.volumeNameUUIDLength > maxUUIDLength) {
		errs = append(errs, fmt.Errorf("volume name UUID length must be -1 (the whole UID) or between 1 and %d, got %d", maxUUIDLength, c.volumeNameUUIDLength))
	} else if c.volumeNamePrefix != "" {
		if err := CheckVolumeNamePrefix(c.volumeNamePrefix, c.volumeNameUUIDLength); err != nil {
			errs = append(errs, err)
		}
	}
	if c.clock == nil {
		errs = append(errs, errors.New("clock must not be nil"))
	}
	if c.identitySet && c.identity == "" {
		errs = append(errs, errors.New("provisioner identity must not be empty"))
	}
	if c.snapshotInf != nil && c.snapshots == nil {
		errs = append(errs, errors.New("a snapshot informer needs the snapshot client"))
	}
	if c.retryStart < 0 || c.retryMax < c.retryStart {
		errs = append(errs, fmt.Errorf("retry intervals: start %s must not be negative nor above max %s", c.retryStart, c.retryMax))
	}
	if c.node != nil {
		if err := c.node.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if !c.identitySet {
		// Upstream's form: <unix ms>-<random 0..9999>-<driver>, and
		// -<node> after it in node deployment.
		c.identity = fmt.Sprintf("%d-%d-%s", c.clock.Now().UnixMilli(), rand.IntN(10000), driverName)
		if c.node != nil {
			c.identity += "-" + c.node.NodeName
		}
	}
	return nil
}

// CheckVolumeNamePrefix returns an error, on one line, when prefix would
// not make valid PersistentVolume names (DNS-1123 subdomains of at most 253
// characters) with uuidLength (see [WithVolumeNameUUIDLength], assumed
// valid): the prefix, a dash and the whole UID (-1) or that many of its
// hex digits.
func CheckVolumeNamePrefix(prefix string, uuidLength int) error {
	n := uuidLength
	if n < 0 {
		n = wholeUIDLength
	}
	if msgs := validation.IsDNS1123Subdomain(prefix + "-" + strings.Repeat("0", n)); len(msgs) > 0 {
		return fmt.Errorf("volume name prefix %q does not start a valid PersistentVolume name (the prefix, a dash and %d characters of the claim UID): %s", prefix, n, strings.Join(msgs, "; "))
	}
	return nil
}

// WithVolumeNamePrefix sets the prefix of PV and CSI volume names
// (--volume-name-prefix, default "pvc"). It must not be empty.
func WithVolumeNamePrefix(prefix string) Option {
	return func(c *config) { c.volumeNamePrefix = prefix }
}

// WithVolumeNameUUIDLength sets how much of the claim UID goes into volume
// names (--volume-name-uuid-length, default -1): -1 keeps the UID with its
// dashes; 1..32 removes the dashes and keeps that many characters.
func WithVolumeNameUUIDLength(n int) Option {
	return func(c *config) { c.volumeNameUUIDLength = n }
}

// WithDefaultFSType sets the filesystem used when the class names none
// (--default-fstype, default none).
func WithDefaultFSType(fsType string) Option {
	return func(c *config) { c.defaultFSType = fsType }
}

// WithExtraCreateMetadata adds the claim name and namespace and the PV name
// to the CreateVolume parameters (--extra-create-metadata, default false).
func WithExtraCreateMetadata(on bool) Option {
	return func(c *config) { c.extraCreateMetadata = on }
}

// WithStrictTopology limits a late-bound volume's topology to the selected
// node's (--strict-topology, default false).
func WithStrictTopology(on bool) Option {
	return func(c *config) { c.strictTopology = on }
}

// WithTopology is the Topology feature gate (default true). False ignores
// the driver's VOLUME_ACCESSIBILITY_CONSTRAINTS capability, as upstream
// with --feature-gates=Topology=false: no accessibility requirements in
// CreateVolume, no node affinity on the PV, no reschedule after
// ResourceExhausted, and no Node or CSINode informer.
func WithTopology(on bool) Option {
	return func(c *config) { c.topologyOff = !on }
}

// WithImmediateTopology sends the aggregated cluster topology for
// immediate-binding claims whose class has no allowedTopologies
// (--immediate-topology, default true). With false, such requests carry no
// accessibility requirements.
func WithImmediateTopology(on bool) Option {
	return func(c *config) { c.immediateTopology = on }
}

// WithControllerPublishReadOnly marks the PV of a claim whose only access
// mode is ReadOnlyMany as read-only (--controller-publish-readonly, default
// false).
func WithControllerPublishReadOnly(on bool) Option {
	return func(c *config) { c.controllerPublishReadOnly = on }
}

// WithIdentity sets the value of the storage.kubernetes.io/csiProvisionerIdentity
// volume attribute of every PV. Default: "<unix ms>-<random 0..9999>-<driver>",
// as upstream.
func WithIdentity(id string) Option {
	return func(c *config) { c.identity, c.identitySet = id, true }
}

// WithEventRecorder sets where events go. The recorder is wrapped in an
// events.Deduplicator unless it already is one, so that a cause seen on
// every retry is reported once. Without this option the provisioner posts
// events to the API server with source component [EventSourceComponent]
// while [Provisioner.RunGuard] runs.
func WithEventRecorder(r record.EventRecorder) Option {
	return func(c *config) { c.recorder = r }
}

// WithBinderEnabled says whether this product's binder runs (default true).
// With false, the in-flight guard removes its finalizer as soon as the
// provisioned PV exists instead of waiting for the claim to be bound.
func WithBinderEnabled(on bool) Option {
	return func(c *config) { c.binderEnabled = on }
}

// WithVolumeAttributesClass is the VolumeAttributesClass feature gate
// (default true). With false, a claim's volumeAttributesClassName is
// ignored.
func WithVolumeAttributesClass(on bool) Option {
	return func(c *config) { c.volumeAttributesClass = on }
}

// WithVolumeAttributesClassesServed says whether the API server serves
// storage.k8s.io/v1 VolumeAttributesClasses (default true; Kubernetes
// before v1.34 serves v1beta1 at most). With false and the gate on, a claim
// that names a class is refused with a message that says so, not with the
// API server's "could not find the requested resource".
func WithVolumeAttributesClassesServed(served bool) Option {
	return func(c *config) { c.vacUnserved = !served }
}

// WithClock replaces the real clock (tests). It is used for the default
// identity and for the waits of node deployment.
func WithClock(clk clock.Clock) Option {
	return func(c *config) { c.clock = clk }
}

// ReferenceGrants tells whether a claim may use a data source in another
// namespace; [refgrant.Lister] implements it from the Gateway API's
// ReferenceGrants.
type ReferenceGrants interface {
	// Allows reports whether the PersistentVolumeClaims of fromNamespace
	// may refer to the object to (in another namespace).
	Allows(fromNamespace string, to refgrant.Reference) (bool, error)
}

// WithReferenceGrants turns on the CrossNamespaceVolumeDataSource feature:
// a claim whose dataSourceRef names a claim or a VolumeSnapshot of another
// namespace is cloned or restored from it when g allows it (upstream's
// "accessing ... isn't allowed" error otherwise, retried). The source is
// protected as in its own namespace: the cloning protection counts pending
// clones of every namespace, and the snapshot sweep pending restores of
// every namespace. Without this option such a claim gets upstream's final
// "feature is disabled" error.
func WithReferenceGrants(g ReferenceGrants) Option {
	return func(c *config) { c.grants = g }
}

// WithRetryIntervals sets the backoff of the provisioner's own queues (the
// cloning protection and the in-flight guard) after a failed write: start,
// doubled at each failure up to max, as upstream's --retry-interval-start
// and --retry-interval-max do for its claim queue. Without it they use
// client-go's default controller backoff (5 ms doubling up to 1000 s).
func WithRetryIntervals(start, max time.Duration) Option {
	return func(c *config) { c.retryStart, c.retryMax = start, max }
}
