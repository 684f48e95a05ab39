package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// Soak parameters: soakClaims claims per round, soakRounds rounds; the
// rounds in soakFaultRounds fail their CreateVolume and DeleteVolume calls
// until the test fixes the secret the driver requires.
const (
	soakClaims = 200
	soakRounds = 5
	// soakGoroutineSlack is how many goroutines above the first round's
	// count a drained sidecar may have (an idle connection of the HTTP or
	// gRPC clients, a retry timer of the event writer).
	soakGoroutineSlack = 10
	// soakHeapPerClaim is how many bytes of live heap (after a forced GC)
	// a claim created and deleted may add. The sidecar keeps some of it on
	// purpose, bounded by size or by time, not by the number of claims
	// ever seen: client-go's event correlators (LRU caches of 512 entries
	// for the sidecar's broadcaster, 4,096 for the provisioning
	// library's, with a token bucket per object), the events
	// deduplicators (10,000 objects) and the expiring records of the last
	// deletions (deleted volumes 30 min, finished deletions 2 min, gone
	// claims and lost volumes 1 h). None of them is full in this test: it
	// measured about 6 KiB per claim and round (a heap profile,
	// /debug/pprof/heap?gc=1, shows what grows). With a copy of each claim
	// and of its PV kept by the provisioner, a leak made on purpose to
	// try this test, it measured 11 KiB.
	soakHeapPerClaim = 9 << 10
	// soakSeriesSlack is how many more series /metrics may have after the
	// last round than after the second: a label value met late (an HTTP
	// code of the API server, a gRPC code), not one per claim.
	soakSeriesSlack = 50
)

var soakFaultRounds = map[int]bool{2: true, 4: true}

// TestSoakChurn is a short soak of the whole sidecar: several rounds of
// soakClaims claims created, provisioned and bound, then deleted until
// claims, PVs and driver volumes are gone; some rounds with CreateVolume
// and DeleteVolume failing first (the driver requires a secret whose value
// the test makes wrong, then right), so that retry, backoff, in-flight and
// event state is created for every claim, and a few calls failing with
// Unavailable in every round (a create possibly in progress). Claims of a
// round reuse the names of the last round's, with new UIDs. After each
// round, when nothing is left, the sidecar must be back where it was: its
// goroutines at the first round's count, no series on /metrics naming a
// claim or a PV, and its live heap (after a GC forced through pprof) not
// growing with the rounds.
//
// The sidecar runs without the cache mutation detector here: the detector
// keeps a copy of every object the informers saw for two minutes, which is
// the heap growth this test looks for.
func TestSoakChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{
		memory: true,
		driverArgs: []string{
			"--require-create-secret=token=good", "--require-delete-secret=token=good",
			"--fail-create-rate=0.05", "--fail-delete-rate=0.05", "--fail-code=Unavailable",
		},
		sidecarArgs: []string{"--http-endpoint=" + endpoint, "--enable-pprof", "-v=2"},
		sidecarEnv:  func(*stack) []string { return []string{e2e.MutationDetectorEnv + "=false"} },
	})
	ctx := t.Context()
	sc, setToken := s.credsClass("soak", "good")
	provisionFailed := metricSeries("controller_persistentvolumeclaim_provision_failed_total", "class", sc.Name, "source", "")
	deleteFailed := metricSeries("controller_persistentvolume_delete_failed_total", "class", sc.Name)

	var baseGoroutines int
	var heaps []soakHeap
	var series []int
	seen := map[string]bool{} // claim UIDs and PV names of every round
	for round := 1; round <= soakRounds; round++ {
		start := time.Now()
		faults := soakFaultRounds[round]
		if faults {
			setToken("bad")
		}
		failedBefore := soakMetric(t, endpoint, provisionFailed)
		for i := range soakClaims {
			claim := s.claim(testutil.NewPVC(s.ns, fmt.Sprintf("soak-%03d", i)).Class(sc.Name))
			seen[string(claim.UID)] = true
		}
		if faults {
			s.waitMetricAtLeast(endpoint, provisionFailed, failedBefore+soakClaims/2)
			setToken("good")
		}
		for _, pv := range s.waitSoakBound() {
			seen[pv] = true
		}
		if faults {
			setToken("bad")
		}
		failedBefore = soakMetric(t, endpoint, deleteFailed)
		if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if faults {
			s.waitMetricAtLeast(endpoint, deleteFailed, failedBefore+soakClaims/2)
			setToken("good")
		}
		s.waitSoakGone(sc.Name)

		if round == 1 {
			baseGoroutines = soakGoroutines(t, endpoint)
		} else {
			soakWaitPoll(t, 30*time.Second, fmt.Sprintf("round %d: goroutines not back to %d (+%d)", round, baseGoroutines, soakGoroutineSlack), func(ctx context.Context) (bool, error) {
				n := soakGoroutines(t, endpoint)
				if n > baseGoroutines+soakGoroutineSlack {
					t.Logf("round %d: %d goroutines, baseline %d", round, n, baseGoroutines)
					return false, nil
				}
				return true, nil
			})
		}
		heap := soakHeapAfterGC(t, endpoint)
		heaps = append(heaps, heap)
		series = append(series, s.checkNoObjectSeries(endpoint, seen))
		t.Logf("round %d (faults %v): %s; goroutines %d (baseline %d); heap in use %.1f MiB, %d objects; %d series",
			round, faults, time.Since(start).Round(time.Millisecond), soakGoroutines(t, endpoint), baseGoroutines,
			float64(heap.inuse)/(1<<20), heap.objects, series[len(series)-1])
	}
	// The first round builds what a sidecar keeps for good (informer
	// indexes, worker state, connection pools); from the second on, the
	// heap may grow only by the bounded records described at
	// soakHeapPerClaim.
	last := len(heaps) - 1
	if grown, limit := heaps[last].inuse-heaps[1].inuse, int64((soakRounds-2)*soakClaims*soakHeapPerClaim); grown > limit {
		t.Errorf("live heap grew by %.1f MiB from round 2 to round %d, more than %d KiB per claim and round (%.1f MiB): %+v",
			float64(grown)/(1<<20), soakRounds, soakHeapPerClaim>>10, float64(limit)/(1<<20), heaps)
	}
	if series[last] > series[1]+soakSeriesSlack {
		t.Errorf("/metrics grew from %d series after round 2 to %d after round %d", series[1], series[last], soakRounds)
	}
}

// soakWaitPoll is testutil.Eventually with a poll interval that spares the
// shared API server: the conditions here list hundreds of objects.
func soakWaitPoll(t *testing.T, timeout time.Duration, msg string, cond func(context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("%s: %v", msg, err)
	}
}

// waitSoakBound waits until every claim of the namespace is Bound and
// returns the names of their PVs.
func (s *stack) waitSoakBound() []string {
	s.t.Helper()
	var pvs []string
	soakWaitPoll(s.t, 3*time.Minute, "claims not all Bound", func(ctx context.Context) (bool, error) {
		claims, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pvs = pvs[:0]
		for _, c := range claims.Items {
			if c.Status.Phase == corev1.ClaimBound {
				pvs = append(pvs, c.Spec.VolumeName)
			}
		}
		return len(pvs) == soakClaims, nil
	})
	return pvs
}

// waitSoakGone waits until the namespace has no claim, no PV of class
// exists and the driver has no volume.
func (s *stack) waitSoakGone(class string) {
	s.t.Helper()
	soakWaitPoll(s.t, 3*time.Minute, "claims, PVs or volumes left", func(ctx context.Context) (bool, error) {
		claims, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(claims.Items) > 0 {
			return false, err
		}
		pvs, err := s.c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, pv := range pvs.Items {
			if pv.Spec.StorageClassName == class {
				return false, nil
			}
		}
		vols, err := s.driver.ListVolumes(ctx)
		return err == nil && len(vols) == 0, err
	})
}

// waitMetricAtLeast waits until series on /metrics is at least want.
func (s *stack) waitMetricAtLeast(endpoint, series string, want float64) {
	s.t.Helper()
	soakWaitPoll(s.t, 2*time.Minute, fmt.Sprintf("%s below %v", series, want), func(ctx context.Context) (bool, error) {
		n, err := metricValue(ctx, endpoint, series)
		return n >= want, err
	})
}

// checkNoObjectSeries fails when a series on /metrics names one of the
// claim UIDs or PV names in seen, or a claim of the test: a label per
// object would grow for as long as the sidecar runs. It returns the number
// of series.
func (s *stack) checkNoObjectSeries(endpoint string, seen map[string]bool) int {
	s.t.Helper()
	code, body, err := httpGet(s.t.Context(), endpoint, "/metrics")
	if err != nil || code != http.StatusOK {
		s.t.Fatalf("/metrics: %d, %v", code, err)
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		n++
		if strings.Contains(line, "soak-") {
			s.t.Errorf("a series names a claim: %s", line)
			continue
		}
		labels, _, _ := strings.Cut(line, " ")
		for _, quoted := range strings.Split(labels, `"`)[1:] {
			if seen[quoted] {
				s.t.Errorf("a series names a claim UID or a PV: %s", line)
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		s.t.Fatal(err)
	}
	return n
}

func soakMetric(t *testing.T, endpoint, series string) float64 {
	t.Helper()
	n, err := metricValue(t.Context(), endpoint, series)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// soakGoroutines returns the sidecar's goroutine count from
// /debug/pprof/goroutine ("goroutine profile: total N").
func soakGoroutines(t *testing.T, endpoint string) int {
	t.Helper()
	code, body, err := httpGet(t.Context(), endpoint, "/debug/pprof/goroutine?debug=1")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/debug/pprof/goroutine: %d, %v", code, err)
	}
	first, _, _ := strings.Cut(body, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(first, "goroutine profile: total "))
	if err != nil {
		t.Fatalf("goroutine profile starts with %q: %v", first, err)
	}
	return n
}

// soakHeap is the sidecar's live heap right after a garbage collection.
type soakHeap struct {
	inuse, objects int64
}

// soakHeapAfterGC forces a garbage collection in the sidecar
// (/debug/pprof/heap?gc=1) and reads the runtime.MemStats the profile's
// text form ends with: HeapInuse and HeapObjects.
func soakHeapAfterGC(t *testing.T, endpoint string) soakHeap {
	t.Helper()
	code, body, err := httpGet(t.Context(), endpoint, "/debug/pprof/heap?gc=1&debug=1")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/debug/pprof/heap: %d, %v", code, err)
	}
	var h soakHeap
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapInuse = "); ok {
			h.inuse, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapObjects = "); ok {
			h.objects, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if h.inuse == 0 || h.objects == 0 {
		t.Fatalf("no HeapInuse or HeapObjects in the heap profile (%d bytes)", len(body))
	}
	return h
}
