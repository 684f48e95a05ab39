package capacity

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics"
)

// gauges gathers the three gauges from registry, by name, and checks that
// they are ALPHA gauges without labels.
func gauges(t *testing.T, registry metrics.KubeRegistry) map[string]float64 {
	t.Helper()
	families, err := registry.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "csistoragecapacities_") {
			continue
		}
		if f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) != 1 || len(f.GetMetric()[0].GetLabel()) != 0 {
			t.Errorf("%s: want one gauge without labels, got %v", f.GetName(), f)
			continue
		}
		if !strings.HasPrefix(f.GetHelp(), "[ALPHA] ") {
			t.Errorf("%s: help %q does not say ALPHA", f.GetName(), f.GetHelp())
		}
		got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
	}
	return got
}

func want(goal, current, obsolete float64) map[string]float64 {
	return map[string]float64{
		"csistoragecapacities_desired_goal":    goal,
		"csistoragecapacities_desired_current": current,
		"csistoragecapacities_obsolete":        obsolete,
	}
}

func TestMetrics(t *testing.T) {
	base := objects(one(wffc("fast"), wffc("bulk")), zoneNode("n1", "a"), zoneNode("n2", "b"))

	tests := []struct {
		name string
		objs []runtime.Object
		want map[string]float64
	}{
		{name: "nothing published yet", objs: base, want: want(4, 0, 0)},
		{
			name: "some published, duplicates count once, obsolete counted",
			objs: objects(base, one(
				csc("x", "fast", "a", 1), csc("y", "fast", "a", 1), csc("z", "bulk", "b", 1),
				csc("old", "gone", "a", 1), csc("old2", "fast", "c", 1),
			)),
			want: want(4, 2, 2),
		},
		{name: "no segments", objs: one(wffc("fast"), csc("old", "fast", "a", 1)), want: want(0, 0, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			registry := metrics.NewKubeRegistry()
			newHarness(t, tt.objs, &fakeDriver{}, WithMetricsRegistry(registry))
			if diff := cmp.Diff(tt.want, gauges(t, registry)); diff != "" {
				t.Errorf("gauges (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMetricsCreated checks that an object created but not yet cached
// counts as current.
func TestMetricsCreated(t *testing.T) {
	registry := metrics.NewKubeRegistry()
	h := newHarness(t, objects(one(wffc("fast")), zoneNode("n1", "a")), &fakeDriver{}, WithMetricsRegistry(registry))
	if err := h.c.syncItem(testContext(t), itemKey("fast", zone("a"))); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want(1, 1, 0), gauges(t, registry)); diff != "" {
		t.Errorf("gauges (-want +got):\n%s", diff)
	}
}

func TestMetricsRegistrationConflict(t *testing.T) {
	registry := metrics.NewKubeRegistry()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(client, &fakeDriver{}, testDriver, testNamespace, factory, WithMetricsRegistry(registry))
	if err != nil {
		t.Fatalf("first New: %v", err)
	}
	c.queue.ShutDown()
	if c, err := New(client, &fakeDriver{}, testDriver, testNamespace, factory, WithMetricsRegistry(registry)); err == nil {
		c.queue.ShutDown()
		t.Fatal("second New with the same registry: no error")
	}
}
