package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
)

const (
	benchNS    = "bench"
	benchClass = "bench"
)

type bench struct {
	o           options
	provisioner *controlplane.Process
	endpoint    string // the provisioner's --http-endpoint
	cp          *controlplane.ControlPlane
	c           kubernetes.Interface
	driver      *e2e.Driver
}

func newBench(cp *controlplane.ControlPlane, o options) *bench {
	cfg := cp.AdminConfig()
	cfg.QPS, cfg.Burst = 1e6, 1e6 // the benchmark's own client is never throttled
	// Protobuf, as the provisioner and kube-controller-manager use: the API
	// server then encodes each watch event once for all watchers.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c := kubernetes.NewForConfigOrDie(cfg)
	return &bench{o: o, cp: cp, c: c}
}

// parallel runs f(i) for i in [0,n) on o.Concurrency goroutines and returns
// the first error.
func (b *bench) parallel(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range b.o.Concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

// measureCeiling writes, as fast as the API server takes them, the minimal
// writes of CeilingN bound volumes: PVC create, PV create, PV status Bound,
// PVC bind (volumeName and annotations), PVC status Bound, in namespace ns,
// which it creates. Nobody else acts on these objects. A first, unmeasured
// batch warms the API server and etcd up. It then removes them all.
func (b *bench) measureCeiling(ctx context.Context, ns string) (ceiling, error) {
	if _, err := b.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return ceiling{}, err
	}
	n := b.o.CeilingN
	warm := min(n, 200)
	// PVs are cluster-scoped: name them after ns, so that a second
	// measurement never meets the first one's PVs still being deleted.
	warmPrefix := ns + "-warm"
	if err := b.writeBoundVolumes(ctx, ns, warmPrefix, warm); err != nil {
		return ceiling{}, fmt.Errorf("ceiling writer warm-up: %w", err)
	}
	if ns == "ceiling" {
		b.profileAPIServer(ctx, "ceiling")
	}
	cpuBefore := b.cpuByProcess()
	start := time.Now()
	if err := b.writeBoundVolumes(ctx, ns, ns, n); err != nil {
		return ceiling{}, fmt.Errorf("ceiling writer: %w", err)
	}
	elapsed := time.Since(start)
	c := ceiling{Volumes: n, Seconds: elapsed.Seconds(), VolumesPerSecond: float64(n) / elapsed.Seconds(), WritesPerSecond: 5 * float64(n) / elapsed.Seconds(),
		CPUPerVolumeMillis: cpuPerVolume(cpuBefore, b.cpuByProcess(), n)}
	if err := b.removeBoundVolumes(ctx, ns, warmPrefix, warm); err != nil {
		return c, err
	}
	if err := b.removeBoundVolumes(ctx, ns, ns, n); err != nil {
		return c, err
	}
	// Wait until the protection controller has let the claims go, so its
	// writes do not count against the provisioner's, and until the PVs are
	// gone, so that no binder meets them in the run.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := b.c.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) > 0 {
			return false, err
		}
		pvs, err := b.c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return !slices.ContainsFunc(pvs.Items, func(pv corev1.PersistentVolume) bool {
			return pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns
		}), nil
	})
	return c, err
}

// writeBoundVolumes writes n bound PVC/PV pairs named prefix-<i> with the
// minimal five writes each.
func (b *bench) writeBoundVolumes(ctx context.Context, ns, prefix string, n int) error {
	return b.parallel(ctx, n, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("%s-%05d", prefix, i)
		pvc, err := b.c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, newClaim(ns, name, "ceiling-nobody"), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "ceiling.invalid"}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				StorageClassName:              "ceiling-nobody",
				ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: name, UID: pvc.UID},
				PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "ceiling.invalid", VolumeHandle: name}},
			},
		}
		if pv, err = b.c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			return err
		}
		pv.Status.Phase = corev1.VolumeBound
		if _, err = b.c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return err
		}
		pvc.Spec.VolumeName = name
		metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, "pv.kubernetes.io/bind-completed", "yes")
		metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, "pv.kubernetes.io/bound-by-controller", "yes")
		if pvc, err = b.c.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			return err
		}
		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.Capacity = pv.Spec.Capacity
		pvc.Status.AccessModes = pv.Spec.AccessModes
		_, err = b.c.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		return err
	})
}

// removeBoundVolumes deletes what writeBoundVolumes wrote. Nobody reclaims
// these objects, so it drops the protection finalizers of the PVs by hand,
// after deleting them: kube-controller-manager's PV protection controller
// puts the finalizer back on a PV that is not being deleted, and keeps a
// Bound one, so a PV whose finalizer went first could stay, terminating,
// through the run.
func (b *bench) removeBoundVolumes(ctx context.Context, ns, prefix string, n int) error {
	return b.parallel(ctx, n, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("%s-%05d", prefix, i)
		if err := b.c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err := b.c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if _, err := b.c.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
}

func newClaim(ns, name, class string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			StorageClassName: &class,
		},
	}
}

// startProvisioner starts our sidecar, or -provisioner-cmd, with the same
// flags, and waits until it serves.
func (b *bench) startProvisioner(ctx context.Context, bins e2e.Binaries, dir string) (*controlplane.Process, error) {
	port, err := controlplane.FreePort()
	if err != nil {
		return nil, err
	}
	b.endpoint = "127.0.0.1:" + strconv.Itoa(port)
	args := []string{
		"--kubeconfig=" + b.cp.KubeconfigPath,
		"--csi-address=" + b.driver.Socket,
		"--http-endpoint=" + b.endpoint,
		"-v=1",
	}
	if b.o.CPUProfile != "" || b.o.HeapProfile != "" {
		args = append(args, "--enable-pprof")
	}
	if b.o.QPS > 0 {
		args = append(args, fmt.Sprintf("--kube-api-qps=%g", b.o.QPS))
	}
	if b.o.Burst > 0 {
		args = append(args, fmt.Sprintf("--kube-api-burst=%d", b.o.Burst))
	}
	args = append(args, strings.Fields(b.o.SidecarArgs)...)
	path := bins.Sidecar
	if b.o.ProvisionerCmd != "" {
		cmd := strings.Fields(b.o.ProvisionerCmd)
		path = cmd[0]
		args = append(cmd[1:], args...)
	} else if b.o.Binder == "kcm" {
		args = append(args, "--enable-binder=false")
	}
	if resolved, err := exec.LookPath(path); err == nil {
		path = resolved
	}
	logf("starting %s %s", path, strings.Join(args, " "))
	var env []string
	if b.o.SidecarEnv != "" {
		env = append(os.Environ(), strings.Fields(b.o.SidecarEnv)...)
		logf("with environment %s", b.o.SidecarEnv)
	}
	p, err := controlplane.StartProcess("provisioner", path, args, env, filepath.Join(dir, "provisioner.log"))
	if err != nil {
		return nil, err
	}
	b.provisioner = p
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: benchClass}, Provisioner: b.driver.Name}
	if _, err := b.c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		return p, err
	}
	if _, err := b.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err != nil {
		return p, err
	}
	// Ready when its metrics endpoint answers and it has logged that the
	// controller started (both ours and upstream log this line).
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case <-p.Exited():
			return false, fmt.Errorf("provisioner exited: %w; log:\n%s", p.ExitErr(), controlplane.TailFile(p.LogPath, 30))
		default:
		}
		return strings.Contains(controlplane.TailFile(p.LogPath, 1000), "Started provisioner controller"), nil
	})
	return p, err
}

// provision creates N claims (all at once or at the offered rate) and waits
// until every one is Bound, recording each claim's latency from the return
// of its create to the moment the watch shows it Bound.
func (b *bench) provision(ctx context.Context, res *result) error {
	n := b.o.N
	created := make([]time.Time, n)
	boundAt := make([]time.Time, n)
	var mu sync.Mutex
	var bound int
	allBound := make(chan struct{})
	index := func(name string) int {
		i, err := strconv.Atoi(strings.TrimPrefix(name, "claim-"))
		if err != nil || i < 0 || i >= n {
			return -1
		}
		return i
	}
	record := func(obj any) {
		pvc, ok := obj.(*corev1.PersistentVolumeClaim)
		if !ok || pvc.Status.Phase != corev1.ClaimBound {
			return
		}
		now := time.Now()
		i := index(pvc.Name)
		if i < 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if boundAt[i].IsZero() {
			boundAt[i] = now
			bound++
			if bound == n {
				close(allBound)
			}
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(b.c, 0, informers.WithNamespace(benchNS))
	inf := factory.Core().V1().PersistentVolumeClaims().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, o any) { record(o) }}); err != nil {
		return err
	}
	ictx, stop := context.WithCancel(ctx)
	defer stop()
	factory.Start(ictx.Done())
	cache.WaitForCacheSync(ictx.Done(), inf.HasSynced)

	before, err := scrapeRequests(ctx, b.c)
	if err != nil {
		return err
	}
	cpuBefore := b.cpuByProcess()
	if b.o.CPUProfile != "" {
		go func() {
			if err := b.saveProfile(ctx, "/debug/pprof/profile?seconds=10", b.o.CPUProfile); err != nil {
				logf("CPU profile: %v", err)
			}
		}()
	}
	logf("creating %d claims (rate %v/s, 0 = all at once)", n, b.o.Rate)
	start := time.Now()
	create := func(ctx context.Context, i int) error {
		_, err := b.c.CoreV1().PersistentVolumeClaims(benchNS).Create(ctx, newClaim(benchNS, fmt.Sprintf("claim-%06d", i), benchClass), metav1.CreateOptions{})
		t := time.Now()
		mu.Lock()
		created[i] = t
		mu.Unlock()
		return err
	}
	if b.o.Rate <= 0 {
		if err := b.parallel(ctx, n, create); err != nil {
			return err
		}
	} else {
		if err := b.paced(ctx, n, create); err != nil {
			return err
		}
	}
	createdAll := time.Since(start)
	logf("created %d claims in %.2fs; waiting until all are Bound", n, createdAll.Seconds())
	// After the creates, so that the profile shows the provisioner's
	// requests rather than the benchmark's.
	b.profileAPIServer(ctx, "provision")
	progress := time.NewTicker(5 * time.Second)
	defer progress.Stop()
wait:
	for {
		select {
		case <-allBound:
			break wait
		case <-progress.C:
			mu.Lock()
			logf("%d/%d Bound after %.1fs", bound, n, time.Since(start).Seconds())
			mu.Unlock()
		case <-ctx.Done():
			return fmt.Errorf("not all claims Bound: %w", ctx.Err())
		}
	}
	elapsed := time.Since(start)
	cpuAfter := b.cpuByProcess()
	res.CPUPerVolumeMillis = cpuPerVolume(cpuBefore, cpuAfter, n)
	// The write rate is over the same interval as the throughput: what
	// the API server took until the last claim was Bound.
	atBound, err := scrapeRequests(ctx, b.c)
	if err != nil {
		return err
	}
	// Events are written after the fact; count them once they have settled.
	after, err := b.settledRequests(ctx)
	if err != nil {
		return err
	}
	lat := make([]float64, n)
	for i := range n {
		lat[i] = boundAt[i].Sub(created[i]).Seconds()
	}
	sort.Float64s(lat)
	res.Provision = phase{
		Seconds: elapsed.Seconds(), VolumesPerSecond: float64(n) / elapsed.Seconds(),
		CreateSeconds: createdAll.Seconds(),
		P50:           pct(lat, 0.50), P95: pct(lat, 0.95), P99: pct(lat, 0.99), Max: lat[n-1],
	}
	if res.Ceiling.VolumesPerSecond > 0 {
		res.Provision.FractionOfCeiling = res.Provision.VolumesPerSecond / res.Ceiling.VolumesPerSecond
	}
	b.recordAPI(ctx, res, after.diff(before), atBound.diff(before), elapsed)
	return nil
}

// recordAPI records the API requests d made for the claims provisioned in
// elapsed, events settled after it: per volume, the provisioner's own
// share. The write rate against the ceiling's is that of untilBound, the
// requests made in elapsed.
func (b *bench) recordAPI(ctx context.Context, res *result, d, untilBound requestCounts, elapsed time.Duration) {
	n := b.o.N
	res.Provision.WritesPerSecond = (untilBound.volumeWrites() + untilBound.events()) / elapsed.Seconds()
	if late := d.volumeWrites() + d.events() - untilBound.volumeWrites() - untilBound.events(); late > 0 {
		logf("%.0f claim, PV and event writes came after the last claim was Bound (counted per volume, not in the write rate)", late)
	}
	// The benchmark itself created the N claims and watches them: report the
	// system's work per volume without them.
	d[requestKey{Verb: "POST", Resource: "persistentvolumeclaims"}] -= float64(n)
	res.API = apiCost(d, n)
	if res.Ceiling.WritesPerSecond > 0 {
		res.Provision.WriteFractionOfCeiling = res.Provision.WritesPerSecond / res.Ceiling.WritesPerSecond
	}
	res.SidecarMetrics = b.scrapeSidecar(ctx)
	res.API.ProvisionerWritesPerVolume = provisionerWrites(res.SidecarMetrics, d) / float64(n)
}

// provisionerWrites counts the object writes of the provisioner process
// from its client's request counters, which tell methods but not
// resources: its PUT and DELETE requests the API server took, and the PV
// creates the API server took (only a provisioner creates PVs here). Its
// POST and PATCH requests are left out: while claims are provisioned they
// are event creates and updates (the provisioning library patches a PV
// only to drop its finalizer when it deletes it). Rejected requests (409
// Conflict and the like) changed nothing and are left out too. Zero
// without request counters.
func provisionerWrites(sidecar map[string]float64, d requestCounts) float64 {
	const prefix = "rest_client_requests_total{"
	var own float64
	for k, v := range sidecar {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		labels := parseLabels(strings.TrimSuffix(k[len(prefix):], "}"))
		if (labels["method"] == "PUT" || labels["method"] == "DELETE") && !rejected(labels["code"]) {
			own += v
		}
	}
	if own == 0 {
		return 0
	}
	return own + d[requestKey{Verb: "POST", Resource: "persistentvolumes"}]
}

// saveProfile saves a pprof profile of the provisioner.
func (b *bench) saveProfile(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.endpoint+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s: %s", resp.Status, body)
	}
	logf("saved %s to %s", path, file)
	return os.WriteFile(file, body, 0o644)
}

// profileAPIServer starts, when asked for, a 5 s CPU profile of
// kube-apiserver in the background and saves it to
// <-apiserver-profile>-<phase>.pprof: where the API server's time goes
// under the ceiling writer's requests and under the provisioner's.
func (b *bench) profileAPIServer(ctx context.Context, phase string) {
	if b.o.APIServerProfile == "" {
		return
	}
	go func() {
		file := b.o.APIServerProfile + "-" + phase + ".pprof"
		body, err := b.c.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "5").DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(file, body, 0o644)
		}
		if err != nil {
			logf("kube-apiserver CPU profile: %v", err)
			return
		}
		logf("saved kube-apiserver's CPU profile to %s", file)
	}()
}

// sidecarCounters are the provisioner's counters the benchmark keeps: its
// API requests and writes (to attribute the API server's counts), its
// driver calls, and the library's deletion outcomes.
var sidecarCounters = []string{
	"rest_client_requests_total{",
	"csi_provisioner_binder_writes_total{",
	"csi_sidecar_operations_seconds_count{",
	"controller_persistentvolume_delete_total{",
	"controller_persistentvolume_delete_failed_total{",
}

// scrapeSidecar reads sidecarCounters, when the provisioner serves them.
func (b *bench) scrapeSidecar(ctx context.Context) map[string]float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.endpoint+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !slices.ContainsFunc(sidecarCounters, func(prefix string) bool { return strings.HasPrefix(line, prefix) }) {
			continue
		}
		i := strings.LastIndex(line, " ")
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil && v > 0 {
			out[line[:i]] = v
		}
	}
	return out
}

// cpuByProcess reads the CPU time used so far by the control plane
// processes, the driver and the provisioner (when it is running).
func (b *bench) cpuByProcess() map[string]time.Duration {
	out := map[string]time.Duration{}
	procs := b.cp.Processes()
	if b.driver != nil {
		procs = append(procs, b.driver.Process)
	}
	if b.provisioner != nil {
		procs = append(procs, b.provisioner)
	}
	for _, p := range procs {
		if u, err := readProc(p.Cmd.Process.Pid); err == nil {
			out[p.Name] = u.CPU
		}
	}
	// The benchmark's own creates, watch and (in the ceiling) writes run
	// on the same cores.
	if u, err := readProc(os.Getpid()); err == nil {
		out["benchmark"] = u.CPU
	}
	return out
}

// cpuPerVolume is the CPU each process used between two cpuByProcess
// readings, per volume, in milliseconds.
func cpuPerVolume(before, after map[string]time.Duration, volumes int) map[string]float64 {
	out := map[string]float64{}
	for name, a := range after {
		out[name] = float64((a - before[name]).Milliseconds()) / float64(volumes)
	}
	return out
}

// settledRequests scrapes the API server's request counters until the
// number of event writes has not changed for two seconds (at most a minute).
func (b *bench) settledRequests(ctx context.Context) (requestCounts, error) {
	var last requestCounts
	stable := 0
	for range 120 {
		cur, err := scrapeRequests(ctx, b.c)
		if err != nil {
			return nil, err
		}
		if last != nil && cur.events() == last.events() {
			stable++
			if stable >= 4 {
				return cur, nil
			}
		} else {
			stable = 0
		}
		last = cur
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return last, nil
}

// paced creates n claims at the offered rate, each on its own goroutine so a
// slow create does not delay the next.
func (b *bench) paced(ctx context.Context, n int, create func(context.Context, int) error) error {
	interval := time.Duration(float64(time.Second) / b.o.Rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if err := create(ctx, i); err != nil {
				errs <- err
			}
		})
		select {
		case <-tick.C:
		case <-ctx.Done():
			wg.Wait()
			return ctx.Err()
		}
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// measureIdle measures the provisioner's CPU use while nothing changes.
func (b *bench) measureIdle(ctx context.Context, pid int, res *result) error {
	logf("measuring idle CPU over %s with %d bound volumes", b.o.Idle, b.o.N)
	u0, err := readProc(pid)
	if err != nil {
		return err
	}
	select {
	case <-time.After(b.o.Idle):
	case <-ctx.Done():
		return ctx.Err()
	}
	u1, err := readProc(pid)
	if err != nil {
		return err
	}
	res.Sidecar.IdleSeconds = b.o.Idle.Seconds()
	res.Sidecar.IdleCPUPercent = 100 * (u1.CPU - u0.CPU).Seconds() / b.o.Idle.Seconds()
	return nil
}
