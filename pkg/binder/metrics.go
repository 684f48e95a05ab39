package binder

import (
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/component-base/metrics"
	storagehelpers "k8s.io/component-helpers/storage/volume"
)

const (
	metricsNamespace = "csi_provisioner"
	metricsSubsystem = "binder"

	resourceVolumes  = "persistentvolumes"
	resourceClaims   = "persistentvolumeclaims"
	verbUpdate       = "update"
	verbUpdateStatus = "update_status"

	resultSuccess  = "success"
	resultConflict = "conflict"
	resultError    = "error"
)

// binderMetrics holds the binder's metrics. The object counts are computed
// on scrape from the informer caches by a custom collector, so they cost
// nothing between scrapes and can never drift; the histogram and the
// counter are updated where the events happen.
type binderMetrics struct {
	bindingLatency *metrics.HistogramVec
	writes         *metrics.CounterVec
}

func newMetrics() *binderMetrics {
	return &binderMetrics{
		bindingLatency: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace:      metricsNamespace,
			Subsystem:      metricsSubsystem,
			Name:           "binding_duration_seconds",
			Help:           "Time from the creation of a claim to the binder setting it Bound, by storage class.",
			Buckets:        []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 1800},
			StabilityLevel: metrics.ALPHA,
		}, []string{"storage_class"}),
		writes: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace:      metricsNamespace,
			Subsystem:      metricsSubsystem,
			Name:           "writes_total",
			Help:           "API writes of the binder, by resource, verb (update, update_status) and result (success, conflict, error).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource", "verb", "result"}),
	}
}

func (m *binderMetrics) register(r metrics.KubeRegistry, b *Binder) error {
	if err := r.Register(m.bindingLatency); err != nil {
		return err
	}
	if err := r.Register(m.writes); err != nil {
		return err
	}
	return r.CustomRegister(newObjectCollector(b))
}

func (m *binderMetrics) countWrite(resource, verb string, err error) {
	result := resultSuccess
	switch {
	case err == nil:
	case apierrors.IsConflict(err):
		result = resultConflict
	default:
		result = resultError
	}
	m.writes.WithLabelValues(resource, verb, result).Inc()
}

var (
	boundVolumesDesc = metrics.NewDesc(metricsNamespace+"_"+metricsSubsystem+"_bound_pv_count",
		"PersistentVolumes of this driver in phase Bound, by storage class.",
		[]string{"storage_class"}, nil, metrics.ALPHA, "")
	unboundVolumesDesc = metrics.NewDesc(metricsNamespace+"_"+metricsSubsystem+"_unbound_pv_count",
		"PersistentVolumes of this driver not in phase Bound, by storage class.",
		[]string{"storage_class"}, nil, metrics.ALPHA, "")
	boundClaimsDesc = metrics.NewDesc(metricsNamespace+"_"+metricsSubsystem+"_bound_pvc_count",
		"PersistentVolumeClaims in the binder's scope in phase Bound, by storage class.",
		[]string{"storage_class"}, nil, metrics.ALPHA, "")
	unboundClaimsDesc = metrics.NewDesc(metricsNamespace+"_"+metricsSubsystem+"_unbound_pvc_count",
		"PersistentVolumeClaims in the binder's scope not in phase Bound, by storage class.",
		[]string{"storage_class"}, nil, metrics.ALPHA, "")
)

// objectCollector counts volumes and claims in scope on each scrape, from
// the informer caches (one pass over each; no API calls).
type objectCollector struct {
	metrics.BaseStableCollector
	b *Binder
}

var _ metrics.StableCollector = (*objectCollector)(nil)

func newObjectCollector(b *Binder) *objectCollector { return &objectCollector{b: b} }

func (c *objectCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- boundVolumesDesc
	ch <- unboundVolumesDesc
	ch <- boundClaimsDesc
	ch <- unboundClaimsDesc
}

func (c *objectCollector) CollectWithStability(ch chan<- metrics.Metric) {
	boundPV, unboundPV, boundPVC, unboundPVC := c.b.countObjects()
	emit := func(desc *metrics.Desc, counts map[string]int) {
		for class, n := range counts {
			ch <- metrics.NewLazyConstMetric(desc, metrics.GaugeValue, float64(n), class)
		}
	}
	emit(boundVolumesDesc, boundPV)
	emit(unboundVolumesDesc, unboundPV)
	emit(boundClaimsDesc, boundPVC)
	emit(unboundClaimsDesc, unboundPVC)
}

// countObjects counts, by storage class, the volumes in scope and the claims
// whose class names this driver or whose volume is in scope.
func (b *Binder) countObjects() (boundPV, unboundPV, boundPVC, unboundPVC map[string]int) {
	boundPV, unboundPV, boundPVC, unboundPVC = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	pvs, err := b.pvLister.List(labels.Everything())
	if err == nil {
		for _, pv := range pvs {
			if !b.volumeInScope(pv) {
				continue
			}
			class := storagehelpers.GetPersistentVolumeClass(pv)
			if pv.Status.Phase == corev1.VolumeBound {
				boundPV[class]++
			} else {
				unboundPV[class]++
			}
		}
	}
	claims, err := b.pvcLister.List(labels.Everything())
	if err == nil {
		for _, c := range claims {
			inScope := b.classIsOurs(c)
			if !inScope && c.Spec.VolumeName != "" {
				pv, err := b.pvLister.Get(c.Spec.VolumeName)
				inScope = err == nil && b.volumeInScope(pv)
			}
			if !inScope {
				continue
			}
			class := storagehelpers.GetPersistentVolumeClaimClass(c)
			if c.Status.Phase == corev1.ClaimBound {
				boundPVC[class]++
			} else {
				unboundPVC[class]++
			}
		}
	}
	return boundPV, unboundPV, boundPVC, unboundPVC
}
