package binder

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func TestMetrics(t *testing.T) {
	bound := claimB("b1").Class("fast").VolumeName("pvb").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimBound).Obj()
	state := objs(classFast(), classOther(),
		claimB("c1").Class("fast").Created(now.Add(-3*time.Second)).Obj(),
		volumeB("pv1").Class("fast").Obj(),
		bound, volumeB("pvb").Class("fast").BoundTo(bound).Phase(corev1.VolumeBound).Obj(),
		claimB("waiting").Class("fast").Size("100Gi").Obj(),
		volumeB("spare").Class("fast").Size("10Mi").Obj(),
		claimB("foreign").Class("other").Obj(),
		testutil.NewPV("foreign", otherDriver).Class("other").Obj(),
	)
	reg := metrics.NewKubeRegistry()
	f := newFixture(t, state, WithMetricsRegistry(reg))
	if _, err := f.runSync("pvc/c1"); err != nil {
		t.Fatal(err)
	}
	f.loadInformers()
	// A conflict is counted as such.
	stale := f.claim("c1").DeepCopy()
	stale.ResourceVersion = "1"
	if _, err := f.binder.updateClaim(f.ctx, stale, "test"); err == nil {
		t.Fatal("update with a stale resourceVersion succeeded")
	}

	want := []string{
		`csi_provisioner_binder_binding_duration_seconds{storage_class="fast"} count=1 sum=3`,
		`csi_provisioner_binder_bound_pv_count{storage_class="fast"} 2`,
		`csi_provisioner_binder_bound_pvc_count{storage_class="fast"} 2`,
		`csi_provisioner_binder_unbound_pv_count{storage_class="fast"} 1`,
		`csi_provisioner_binder_unbound_pvc_count{storage_class="fast"} 1`,
		`csi_provisioner_binder_writes_total{resource="persistentvolumeclaims",result="conflict",verb="update"} 1`,
		`csi_provisioner_binder_writes_total{resource="persistentvolumeclaims",result="success",verb="update"} 1`,
		`csi_provisioner_binder_writes_total{resource="persistentvolumeclaims",result="success",verb="update_status"} 1`,
		`csi_provisioner_binder_writes_total{resource="persistentvolumes",result="success",verb="update"} 1`,
		`csi_provisioner_binder_writes_total{resource="persistentvolumes",result="success",verb="update_status"} 1`,
	}
	if diff := cmp.Diff(want, gather(t, reg)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// TestBindingLatencyNotObservedOnRebind: a Lost claim whose volume comes
// back is bound again; csi_provisioner_binder_binding_duration_seconds
// (claim created → Bound) gets no second sample of the claim's whole age.
func TestBindingLatencyNotObservedOnRebind(t *testing.T) {
	lost := claimB("c1").Class("fast").Created(now.Add(-24*time.Hour)).VolumeName("pv1").
		Annotation(annBindCompleted, "yes").Phase(corev1.ClaimLost).Obj()
	pv := volumeB("pv1").Class("fast").BoundTo(lost).Phase(corev1.VolumeBound).Obj()
	reg := metrics.NewKubeRegistry()
	f := newFixture(t, objs(classFast(), lost, pv), WithMetricsRegistry(reg))
	if _, err := f.runSync("pvc/c1"); err != nil {
		t.Fatal(err)
	}
	if got := f.claim("c1").Status.Phase; got != corev1.ClaimBound {
		t.Fatalf("claim phase %q, want Bound", got)
	}
	for _, line := range gather(t, reg) {
		if strings.HasPrefix(line, "csi_provisioner_binder_binding_duration_seconds") {
			t.Errorf("a Lost claim bound again was observed as a new binding: %s", line)
		}
	}
}

// gather renders the binder's metrics in reg as sorted lines
// "name{label="value",...} value" (histograms: count and sum).
func gather(t *testing.T, reg metrics.KubeRegistry) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range families {
		if !strings.HasPrefix(mf.GetName(), "csi_provisioner_binder_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			name := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				out = append(out, fmt.Sprintf("%s %g", name, m.GetGauge().GetValue()))
			case dto.MetricType_COUNTER:
				out = append(out, fmt.Sprintf("%s %g", name, m.GetCounter().GetValue()))
			case dto.MetricType_HISTOGRAM:
				out = append(out, fmt.Sprintf("%s count=%d sum=%g", name, m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()))
			}
		}
	}
	sort.Strings(out)
	return out
}
