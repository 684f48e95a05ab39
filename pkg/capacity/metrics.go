package capacity

import (
	"k8s.io/component-base/metrics"
)

// The gauges keep upstream's names so dashboards work unchanged. They are
// computed on scrape from the desired set and the informer cache, so they
// cannot drift and cost nothing between scrapes.
var (
	desiredGoalDesc = metrics.NewDesc("csistoragecapacities_desired_goal",
		"Number of CSIStorageCapacity objects the controller wants to publish: one per topology segment and storage class.",
		nil, nil, metrics.ALPHA, "")
	desiredCurrentDesc = metrics.NewDesc("csistoragecapacities_desired_current",
		"Number of CSIStorageCapacity objects the controller wants to publish that exist.",
		nil, nil, metrics.ALPHA, "")
	obsoleteDesc = metrics.NewDesc("csistoragecapacities_obsolete",
		"Number of CSIStorageCapacity objects of this driver that exist but match no wanted object and are to be deleted.",
		nil, nil, metrics.ALPHA, "")
)

// collector reports the three gauges of a [Controller].
type collector struct {
	metrics.BaseStableCollector
	c *Controller
}

var _ metrics.StableCollector = (*collector)(nil)

func (m *collector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- desiredGoalDesc
	ch <- desiredCurrentDesc
	ch <- obsoleteDesc
}

func (m *collector) CollectWithStability(ch chan<- metrics.Metric) {
	goal, current, obsolete := m.c.counts()
	ch <- metrics.NewLazyConstMetric(desiredGoalDesc, metrics.GaugeValue, float64(goal))
	ch <- metrics.NewLazyConstMetric(desiredCurrentDesc, metrics.GaugeValue, float64(current))
	ch <- metrics.NewLazyConstMetric(obsoleteDesc, metrics.GaugeValue, float64(obsolete))
}
