package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestBrokenClassIsolation: one class whose backend pool is down (every
// CreateVolume of it hangs until the sidecar's --timeout) next to a
// healthy class. With more hanging claims than workers, claims of the
// healthy class created after them still bind: the library's queue hands
// them to the first worker a timed-out call frees, and the retries of the
// broken claims wait out their backoff instead of taking every worker
// again. The broken claims are then deleted while the pool is still down:
// each keeps the in-flight finalizer, since a create may be running in the
// backend. Once the pool is back, each retried CreateVolume creates the
// volume, which is recorded in a PV, bound (which lets the claim go),
// Released and deleted: no claim, PV or volume is left, and nothing is
// logged as an error on the way.
func TestBrokenClassIsolation(t *testing.T) {
	const (
		workers = 4
		broken  = 3 * workers // three rounds of hanging calls
		healthy = 3
		timeout = 2 * time.Second
	)
	cp := controlplane.Need(t, shared)
	ctx, c := t.Context(), cp.Client()
	ns := generatedNamespace(t, c, "isolation-")
	d := &poolDriver{controllerDriver: controllerDriver{name: ns + ".pool.csi.kube-storage.io"}, volumes: map[string]bool{}}
	d.down.Store(true)
	socket := serveDriver(t, d)

	// Registered after the server's stop, so the sidecar stops first.
	sidecar := startSidecarFor(t, cp, socket, "-v=2", fmt.Sprintf("--worker-threads=%d", workers), "--timeout="+timeout.String(),
		"--retry-interval-start=500ms", "--retry-interval-max=4s")
	bad := testutil.CreateClass(t, c, testutil.NewSC(ns+"-down", d.name).Param("pool", "down").Obj())
	good := testutil.CreateClass(t, c, testutil.NewSC(ns+"-up", d.name).Param("pool", "up").Obj())
	claims := c.CoreV1().PersistentVolumeClaims(ns)
	for i := range broken {
		if _, err := claims.Create(ctx, testutil.NewPVC(ns, fmt.Sprintf("down-%d", i)).Class(bad.Name).Size("1Gi").RV("").Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "every worker busy with a hanging CreateVolume", func(context.Context) (bool, error) {
		return d.hanging.Load() == workers, nil
	})

	start := time.Now()
	for i := range healthy {
		if _, err := claims.Create(ctx, testutil.NewPVC(ns, fmt.Sprintf("up-%d", i)).Class(good.Name).Size("1Gi").RV("").Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 0, "healthy claims not Bound", countClaims(c, ns, "up-", healthy, isBoundClaim))
	// Every broken claim ahead of them takes a worker for one timeout; a
	// bound of rounds × timeout, plus slack for a loaded machine, shows
	// that their retries did not keep every worker busy.
	took, limit := time.Since(start), (broken/workers)*timeout+20*time.Second
	if took > limit {
		t.Errorf("healthy claims Bound after %v, want under %v", took, limit)
	}
	t.Logf("healthy claims Bound %v after they were created", took)

	// Deleted while the pool is down: a CreateVolume may still be running,
	// so every claim stays.
	for i := range broken {
		if err := claims.Delete(ctx, fmt.Sprintf("down-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	calls := d.calls.Load()
	testutil.Eventually(t, 0, "CreateVolume of the deleted claims not retried", func(context.Context) (bool, error) {
		return d.calls.Load() >= calls+broken, nil
	})
	if n, err := countClaims(c, ns, "down-", broken, func(pvc *corev1.PersistentVolumeClaim) bool {
		return pvc.DeletionTimestamp != nil && len(pvc.Finalizers) > 0
	})(ctx); err != nil || !n {
		t.Errorf("claims deleted while their CreateVolume may run: not all kept by their finalizer (err %v)", err)
	}

	// The pool is back: every claim goes, with its volume and PV.
	d.down.Store(false)
	testutil.Eventually(t, 2*time.Minute, "deleted claims not gone", countClaims(c, ns, "down-", 0, func(*corev1.PersistentVolumeClaim) bool { return true }))
	testutil.Eventually(t, 2*time.Minute, "volumes of deleted claims not deleted", func(context.Context) (bool, error) {
		return d.live() == healthy, nil
	})
	testutil.Eventually(t, 0, "PVs of deleted claims not deleted", func(ctx context.Context) (bool, error) {
		pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for _, pv := range pvs.Items {
			if pv.Spec.StorageClassName == bad.Name {
				n++
			}
		}
		return n == 0, nil
	})
	if got := d.created.Load(); got != broken+healthy {
		t.Errorf("volumes created: %d, want %d", got, broken+healthy)
	}
	log, err := os.ReadFile(sidecar.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "Sync failed") {
			t.Errorf("sidecar logged an error: %s", line)
		}
	}
}

func isBoundClaim(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Status.Phase == corev1.ClaimBound
}

// countClaims returns a condition that holds when exactly want claims of
// namespace ns whose names start with prefix satisfy ok.
func countClaims(c kubernetes.Interface, ns, prefix string, want int, ok func(*corev1.PersistentVolumeClaim) bool) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		list, err := c.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := 0
		for i := range list.Items {
			if strings.HasPrefix(list.Items[i].Name, prefix) && ok(&list.Items[i]) {
				n++
			}
		}
		return n == want, nil
	}
}

// poolDriver is a CSI controller with two pools, chosen by the class
// parameter "pool": while down is set, every CreateVolume of pool "down"
// hangs until the caller gives up; everything else succeeds at once.
type poolDriver struct {
	controllerDriver
	down atomic.Bool
	// calls counts the CreateVolume calls of pool "down", hanging the
	// ones in progress, created the volumes created.
	calls, hanging, created atomic.Int64

	mu      sync.Mutex
	volumes map[string]bool
}

func (d *poolDriver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetParameters()["pool"] == "down" {
		d.calls.Add(1)
		if d.down.Load() {
			d.hanging.Add(1)
			defer d.hanging.Add(-1)
			<-ctx.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.volumes[req.GetName()] {
		d.volumes[req.GetName()] = true
		d.created.Add(1)
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: req.GetName(), CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}}, nil
}

func (d *poolDriver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.volumes, req.GetVolumeId())
	return &csi.DeleteVolumeResponse{}, nil
}

// live returns the number of volumes that exist.
func (d *poolDriver) live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.volumes)
}
