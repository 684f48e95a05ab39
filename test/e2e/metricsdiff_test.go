package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// The test in this file scrapes upstream external-provisioner's /metrics
// and this sidecar's after the same flows, on one control plane whose
// kube-controller-manager runs its PV binder, and compares what dashboards
// and alerts are built on: the metric families with their type and label
// names, the label values each flow leaves, and the HTTP status of each
// path upstream serves. It also compares the events of the flows that
// binderoff_test.go does not cover: a CreateVolume failing with a final and
// with a non-final error.

// failParam is the class parameter that makes paramDriver fail CreateVolume
// with the named gRPC code.
const failParam = "fail"

// failDeleteParam is the class parameter that makes paramDriver fail
// DeleteVolume (INTERNAL) for the volumes of the class, whose IDs it ends
// with failDeleteSuffix.
const failDeleteParam, failDeleteSuffix = "failDelete", "-faildelete"

// paramDriver creates volumes in memory, and fails CreateVolume with the
// code its class's parameter "fail" names.
type paramDriver struct {
	controllerDriver
	mu   sync.Mutex
	vols map[string]int64 // volume ID -> bytes
}

func (d *paramDriver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if name := req.GetParameters()[failParam]; name != "" {
		code, ok := map[string]codes.Code{"InvalidArgument": codes.InvalidArgument, "Unavailable": codes.Unavailable}[name]
		if !ok {
			return nil, status.Errorf(codes.Internal, "bad %s parameter %q", failParam, name)
		}
		return nil, status.Errorf(code, "told to fail with %s", name)
	}
	size := max(req.GetCapacityRange().GetRequiredBytes(), 1<<20)
	id := req.GetName()
	if req.GetParameters()[failDeleteParam] != "" {
		id += failDeleteSuffix
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.vols[id] = size
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: size}}, nil
}

func (d *paramDriver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if strings.HasSuffix(req.GetVolumeId(), failDeleteSuffix) {
		return nil, status.Error(codes.Internal, "told to fail delete")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.vols, req.GetVolumeId())
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *paramDriver) volumes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.vols)
}

// scraped is one side of the comparison: upstream's or this sidecar's.
type scraped struct {
	name     string
	stack    *stack
	driver   *paramDriver
	endpoint string
}

// startScraped serves a paramDriver named side+".csi.kube-storage.io" and
// starts bin against it in a namespace of its own, with leader election
// (its Lease in that namespace), --http-endpoint and --enable-pprof.
func startScraped(t *testing.T, cp *controlplane.ControlPlane, side, bin string, args ...string) *scraped {
	t.Helper()
	c := cp.Client()
	ns := generatedNamespace(t, c, "metricsdiff-"+side+"-")
	d := &paramDriver{controllerDriver: controllerDriver{name: side + ".csi.kube-storage.io"}, vols: map[string]int64{}}
	socket := serveDriver(t, d)
	sc := &scraped{
		name:     side,
		stack:    &stack{t: t, cp: cp, c: c, ns: ns, className: ns},
		driver:   d,
		endpoint: "127.0.0.1:" + strconv.Itoa(freePort(t)),
	}
	logPath := filepath.Join(filepath.Dir(socket), side+".log")
	sidecar, err := e2e.StartSidecar(bin, e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: socket, LogPath: logPath,
		Args: append([]string{
			"-v=4", "--http-endpoint=" + sc.endpoint, "--enable-pprof",
			"--retry-interval-start=200ms", "--retry-interval-max=2s",
			"--leader-election", "--leader-election-namespace=" + ns,
			"--leader-election-lease-duration=4s", "--leader-election-renew-deadline=3s", "--leader-election-retry-period=1s",
		}, args...),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sidecar.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s log:\n%s", side, controlplane.TailFile(logPath, 40))
		}
	})
	if err := sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	return sc
}

// class creates a class of the side's driver named after the flow, with
// parameters.
func (sc *scraped) class(flow string, params map[string]string) *storagev1.StorageClass {
	s := sc.stack
	b := testutil.NewSC(s.ns+"-"+flow, sc.driver.name)
	for k, v := range params {
		b.Param(k, v)
	}
	return testutil.CreateClass(s.t, s.c, b.Obj())
}

// flowEvents returns the events about the claim named after the flow and
// its PV, as "Kind Type Reason: message", normalized, without counts,
// sorted and deduplicated.
func (sc *scraped) flowEvents(claim *corev1.PersistentVolumeClaim, pvName string) []string {
	s := sc.stack
	s.t.Helper()
	var out []string
	for _, e := range s.events(s.ns, string(claim.UID)) {
		out = append(out, "PersistentVolumeClaim "+e)
	}
	if pvName != "" {
		list, err := s.c.CoreV1().Events(metav1.NamespaceDefault).List(s.t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pvName})
		if err != nil {
			s.t.Fatal(err)
		}
		for _, e := range list.Items {
			out = append(out, fmt.Sprintf("PersistentVolume %s %s: %s", e.Type, e.Reason, e.Message))
		}
	}
	for i := range out {
		out[i] = sc.normalize(out[i])
		if pvName != "" {
			out[i] = strings.ReplaceAll(out[i], pvName, "PV")
		}
	}
	// kube-controller-manager's binder may see a claim before the class
	// created just before it, and says the class is not found.
	out = slices.DeleteFunc(out, func(e string) bool {
		return claim.Name != "late" && strings.Contains(e, `ProvisioningFailed: storageclass.storage.k8s.io "`)
	})
	sort.Strings(out)
	return slices.Compact(out)
}

var callPrefix = regexp.MustCompile(`(CreateVolume|DeleteVolume) "[^"]*": rpc error`)

func (sc *scraped) normalize(text string) string {
	text = strings.ReplaceAll(text, sc.driver.name, "DRIVER")
	text = strings.ReplaceAll(text, sc.stack.ns, "NS")
	text = uidPattern.ReplaceAllString(text, "UID")
	// README, "HTTP endpoints and metrics": this sidecar names the call and
	// the volume before a CSI error.
	return callPrefix.ReplaceAllString(text, "rpc error")
}

func (sc *scraped) upstream() bool { return sc.name == "upstream" }

// scrape parses the side's /metrics.
func (sc *scraped) scrape(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+sc.endpoint+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: GET /metrics: %w", sc.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: GET /metrics: %s", sc.name, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: parse /metrics: %w", sc.name, err)
	}
	return fams, nil
}

// familyShape is "TYPE label,label" of a family, and a histogram's bucket
// bounds (what histogram_quantile works with).
func familyShape(f *dto.MetricFamily) string {
	names := map[string]bool{}
	var buckets []string
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			names[l.GetName()] = true
		}
		if h := m.GetHistogram(); h != nil && buckets == nil {
			for _, b := range h.GetBucket() {
				buckets = append(buckets, strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
			}
		}
	}
	shape := f.GetType().String() + " " + strings.Join(slices.Sorted(maps.Keys(names)), ",")
	if buckets != nil {
		shape += " le=" + strings.Join(buckets, ",")
	}
	return shape
}

// seriesOf returns the label sets of family's series, normalized, as
// "name{k=v,...}"; a histogram or summary's series counts only once it
// has observed something, a counter once it is above 0.
func (sc *scraped) seriesOf(fams map[string]*dto.MetricFamily, family string) []string {
	f := fams[family]
	if f == nil {
		return nil
	}
	var out []string
	for _, m := range f.GetMetric() {
		if m.GetHistogram() != nil && m.GetHistogram().GetSampleCount() == 0 || m.GetCounter() != nil && m.GetCounter().GetValue() == 0 {
			continue
		}
		var kv []string
		for _, l := range m.GetLabel() {
			kv = append(kv, l.GetName()+"="+sc.normalize(l.GetValue()))
		}
		sort.Strings(kv)
		out = append(out, family+"{"+strings.Join(kv, ",")+"}")
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// Families that only one side has, on purpose (README, "HTTP endpoints and
// metrics").
var (
	// upstreamOnlyFamily: upstream links kube-apiserver libraries.
	upstreamOnlyFamily = func(name string) bool {
		return strings.HasPrefix(name, "apiserver_") || strings.HasPrefix(name, "aggregator_")
	}
	// oursOnlyFamily: the binder's own metrics, and client-go's request
	// metrics, which upstream does not register.
	oursOnlyFamily = func(name string) bool {
		return strings.HasPrefix(name, "csi_provisioner_binder_") || strings.HasPrefix(name, "rest_client_")
	}
	// oursOnlySeries: the queues of the in-flight finalizer's guard and
	// of the binder.
	oursOnlySeries = func(series string) bool {
		return strings.HasPrefix(series, "workqueue_") &&
			(strings.Contains(series, "{name=inflight_guard}") || strings.Contains(series, "{name=binder_"))
	}
)

// upstreamDoubleDelete is the failure upstream may count for a volume
// deleted once (external-provisioner issue #1235; README, "How it
// compares with upstream", claims deleted together).
const upstreamDoubleDelete = "controller_persistentvolume_delete_failed_total{class=NS-ok}"

// comparedSeries are the families whose label values are compared series
// by series: the CSI calls, the provisioning library's outcomes, the
// workqueues (by name) and leader election.
var comparedSeries = []string{
	"csi_sidecar_operations_seconds",
	"controller_persistentvolumeclaim_provision_total",
	"controller_persistentvolumeclaim_provision_failed_total",
	"controller_persistentvolumeclaim_provision_duration_seconds",
	"controller_persistentvolume_delete_total",
	"controller_persistentvolume_delete_failed_total",
	"controller_persistentvolume_delete_duration_seconds",
	"workqueue_adds_total",
	"leader_election_master_status",
	"promhttp_metric_handler_requests_total",
}

// metricsReport is what one side's scrape shows.
type metricsReport struct {
	Families map[string]string // name -> familyShape
	Series   []string
}

func (sc *scraped) report(fams map[string]*dto.MetricFamily) metricsReport {
	rep := metricsReport{Families: map[string]string{}}
	for name, f := range fams {
		if sc.upstream() && upstreamOnlyFamily(name) || !sc.upstream() && oursOnlyFamily(name) {
			continue
		}
		rep.Families[name] = familyShape(f)
	}
	for _, family := range comparedSeries {
		for _, series := range sc.seriesOf(fams, family) {
			if sc.upstream() && series == upstreamDoubleDelete || !sc.upstream() && oursOnlySeries(series) {
				continue
			}
			rep.Series = append(rep.Series, series)
		}
	}
	return rep
}

// TestMetricsMatchUpstream runs the same flows on upstream external-
// provisioner and on this sidecar with its binder off, each against a
// driver of its own, then compares their /metrics, the events of each
// flow and the HTTP status of upstream's paths.
func TestMetricsMatchUpstream(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	upBin, ourBin := diffBinaries(t)
	sides := []*scraped{
		startScraped(t, cp, "upstream", upBin),
		startScraped(t, cp, "ours", ourBin, "--enable-binder=false"),
		// With its binder on too, next to kube-controller-manager's: the
		// metrics only, its events are its binder's.
		startScraped(t, cp, "binder", ourBin),
	}

	events := make([]map[string][]string, len(sides))
	for i, sc := range sides {
		events[i] = sc.runFlows()
	}
	if diff := cmp.Diff(events[0], events[1]); diff != "" {
		t.Errorf("events differ from upstream's (-upstream +ours):\n%s", diff)
	}

	// The metrics: polled until the sides agree (a counter is bumped
	// after the event that ends a flow), else the last difference fails.
	diffs := make([]string, len(sides))
	var scrapeErr error // the first, reported if the sides were never compared
	reps := make([]metricsReport, len(sides))
	_ = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		for i, sc := range sides {
			fams, err := sc.scrape(ctx)
			if err != nil {
				if scrapeErr == nil {
					scrapeErr = err
				}
				return false, nil
			}
			reps[i] = sc.report(fams)
		}
		same := true
		for i := 1; i < len(sides); i++ {
			diffs[i] = cmp.Diff(reps[0], reps[i])
			same = same && diffs[i] == ""
		}
		return same, nil
	})
	for i, rep := range reps {
		if rep.Families == nil {
			t.Fatalf("/metrics of %s not scraped: %v", sides[i].name, scrapeErr)
		}
	}
	for i, diff := range diffs {
		if diff != "" {
			t.Errorf("/metrics of %s differs from upstream's (-upstream +%s):\n%s", sides[i].name, sides[i].name, diff)
		}
	}
	t.Logf("compared series:\n%s", strings.Join(reps[1].Series, "\n"))

	// The HTTP paths upstream serves, and some it does not.
	for _, path := range []string{
		"/metrics", "/healthz/leader-election", "/debug/pprof/", "/debug/pprof/cmdline",
		"/debug/pprof/symbol", "/debug/pprof/goroutine?debug=1", "/debug/pprof/trace?seconds=0",
		"/healthz", "/", "/nothing",
	} {
		var want int
		for i, sc := range sides {
			code, _, err := httpGet(t.Context(), sc.endpoint, path)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				want = code
			} else if code != want {
				t.Errorf("GET %s: upstream answers %d, %s %d", path, want, sc.name, code)
			}
		}
	}
}

// runFlows runs the flows on the side and returns the events of each.
func (sc *scraped) runFlows() map[string][]string {
	s := sc.stack
	t := s.t
	out := map[string][]string{}

	// Provisioned and deleted.
	ok := sc.class("ok", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "ok").Class(ok.Name))
	_, pv := s.waitBound(claim.Name)
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeNormal, "ProvisioningSucceeded", pv.Name)
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(claim.Name, "claim ok not deleted")
	testutil.Eventually(t, 0, "PV "+pv.Name+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return sc.driver.volumes() == 0 && err != nil, ignoreNotFound(err)
	})
	out["ok"] = sc.flowEvents(claim, pv.Name)

	// CreateVolume failing with a final and a non-final error: the claim
	// stays Pending with a Warning. (Deleting the second would differ on
	// purpose: this sidecar keeps a claim whose create may be running
	// until the driver answers for good, README "How it compares".)
	for _, code := range []string{"InvalidArgument", "Unavailable"} {
		flow := strings.ToLower(code)
		class := sc.class(flow, map[string]string{failParam: code})
		claim := s.claim(testutil.NewPVC(s.ns, flow).Class(class.Name))
		s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeWarning, "ProvisioningFailed", "told to fail with "+code)
		out[flow] = sc.flowEvents(claim, "")
	}

	// DeleteVolume failing: the PV stays Released with a Warning.
	fd := sc.class("faildelete", map[string]string{failDeleteParam: "yes"})
	claim = s.claim(testutil.NewPVC(s.ns, "faildelete").Class(fd.Name))
	_, pv = s.waitBound(claim.Name)
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeNormal, "ProvisioningSucceeded", pv.Name)
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(t.Context(), claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(metav1.NamespaceDefault, string(pv.UID), corev1.EventTypeWarning, "VolumeFailedDelete", "told to fail delete")
	out["faildelete"] = sc.flowEvents(claim, pv.Name)

	// A claim of a class that does not exist (yet): kube-controller-
	// manager's binder says so; the class then appears and the claim is
	// provisioned.
	name := s.className + "-late"
	claim = s.claim(testutil.NewPVC(s.ns, "late").Class(name))
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeWarning, "ProvisioningFailed", "not found")
	sc.class("late", nil)
	_, pv = s.waitBound(claim.Name)
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeNormal, "ProvisioningSucceeded", pv.Name)
	out["late"] = sc.flowEvents(claim, pv.Name)
	return out
}
