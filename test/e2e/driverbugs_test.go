package e2e

import (
	"context"
	"path/filepath"
	"slices"
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
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// buggyDriver is a CSI controller whose CreateVolume and DeleteVolume
// answers a test scripts, to see how the sidecar treats a driver under
// development that answers wrongly. It records the calls.
type buggyDriver struct {
	controllerDriver
	create func(*csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error)
	delete func(*csi.DeleteVolumeRequest) error // nil: success

	mu      sync.Mutex
	creates []string // names
	deletes []string // volume IDs
}

var (
	_ csi.IdentityServer   = (*buggyDriver)(nil)
	_ csi.ControllerServer = (*buggyDriver)(nil)
)

func (d *buggyDriver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d.mu.Lock()
	d.creates = append(d.creates, req.GetName())
	d.mu.Unlock()
	return d.create(req)
}

func (d *buggyDriver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	d.mu.Lock()
	d.deletes = append(d.deletes, req.GetVolumeId())
	d.mu.Unlock()
	if d.delete != nil {
		if err := d.delete(req); err != nil {
			return nil, err
		}
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// deleted returns the volume IDs DeleteVolume was called with.
func (d *buggyDriver) deleted() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.deletes)
}

// startBuggy serves d on a unix socket of the test and starts the sidecar
// against it; it returns a stack for the namespace ns (no hostpath
// driver: s.driver is nil).
func startBuggy(t *testing.T, cp *controlplane.ControlPlane, ns string, d *buggyDriver, args ...string) *stack {
	t.Helper()
	socket := serveDriver(t, d)
	// Registered after the server's stop, so the sidecar stops first.
	sidecar := startSidecarFor(t, cp, socket, append([]string{"--retry-interval-start=200ms", "--retry-interval-max=2s"}, args...)...)
	return &stack{t: t, cp: cp, c: cp.Client(), ns: ns, sidecar: sidecar}
}

// TestDriverReturnsAnotherClaimsVolume: a driver that answers every
// CreateVolume with the same volume ID (it ignores the name). The first
// claim gets the volume; the second must not get a PV of it (two claims
// would share the data, and deleting either would delete the other's): it
// stays Pending with a Warning naming the driver, the ID and the PV that
// has it, and no DeleteVolume is sent for the volume the first claim uses.
func TestDriverReturnsAnotherClaimsVolume(t *testing.T) {
	cp := controlplane.Need(t, shared)
	c := cp.Client()
	ns := generatedNamespace(t, c, "same-id-")
	d := &buggyDriver{controllerDriver: controllerDriver{name: ns + ".buggy.csi.kube-storage.io"}, create: func(req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
		return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-same", CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}}, nil
	}}
	s := startBuggy(t, cp, ns, d)
	sc := testutil.CreateClass(t, c, testutil.NewSC(ns, d.name).Obj())

	s.claim(testutil.NewPVC(ns, "first").Class(sc.Name).Size("1Gi"))
	_, pv := s.waitBound("first")
	second := s.claim(testutil.NewPVC(ns, "second").Class(sc.Name).Size("1Gi"))
	s.waitEvent(ns, string(second.UID), "Warning", "ProvisioningFailed",
		`CSI driver `+d.name+` returned volume ID "vol-same" for volume pvc-`+string(second.UID)+`, but PersistentVolume `+pv.Name+` already records that volume`)

	if got, err := c.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), second.Name, metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.ClaimPending {
		t.Fatalf("second claim = %v, %v; want Pending", got.Status.Phase, err)
	}
	if got := d.deleted(); len(got) != 0 {
		t.Fatalf("DeleteVolume calls %q while the first claim uses the volume", got)
	}
	// The second claim, deleted, keeps the in-flight finalizer: the
	// driver may have created a volume of its name that it did not
	// report. The first claim's deletion deletes the one volume once.
	s.deleteAndWaitClaimOnly("first", pv.Name)
	if got := d.deleted(); !slices.Equal(got, []string{"vol-same"}) {
		t.Errorf("DeleteVolume calls %q, want one for vol-same", got)
	}
}

// deleteAndWaitClaimOnly deletes the claim and waits until it and its PV
// are gone (for stacks without a hostpath driver to list).
func (s *stack) deleteAndWaitClaimOnly(name, pvName string) {
	s.t.Helper()
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.waitClaimGone(name, "claim "+name+" not deleted")
	testutil.Eventually(s.t, 0, "PV "+pvName+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		return ignoreNotFound(err) == nil && err != nil, ignoreNotFound(err)
	})
}

// TestDriverDeleteVolumeAnswers: a driver whose DeleteVolume first refuses
// (FAILED_PRECONDITION: the volume has snapshots) and then answers
// NOT_FOUND, which CSI says must be OK for a volume that does not exist.
// Both are explained on the PV and retried with backoff; NOT_FOUND is not
// taken for deleted (drivers also answer it for a volume their backend
// cannot find for now, and the volume would leak), and its Warning says
// how to let the PV go: reclaim policy Retain, then delete the PV, which
// the test does.
func TestDriverDeleteVolumeAnswers(t *testing.T) {
	cp := controlplane.Need(t, shared)
	c := cp.Client()
	ns := generatedNamespace(t, c, "delete-answers-")
	var refusals atomic.Int32
	d := &buggyDriver{
		controllerDriver: controllerDriver{name: ns + ".buggy.csi.kube-storage.io"},
		create: func(req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
			return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-" + req.GetName(), CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}}, nil
		},
		delete: func(*csi.DeleteVolumeRequest) error {
			if refusals.Add(1) <= 2 {
				return status.Error(codes.FailedPrecondition, "volume has snapshots")
			}
			return status.Error(codes.NotFound, "no such volume")
		},
	}
	s := startBuggy(t, cp, ns, d)
	sc := testutil.CreateClass(t, c, testutil.NewSC(ns, d.name).Obj())
	s.claim(testutil.NewPVC(ns, "data").Class(sc.Name).Size("1Gi"))
	_, pv := s.waitBound("data")

	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent("", string(pv.UID), "Warning", "VolumeFailedDelete", "volume has snapshots")
	s.waitEvent("", string(pv.UID), "Warning", "VolumeFailedDelete",
		"no such volume; CSI requires DeleteVolume to answer OK for a volume that does not exist, so NotFound is not taken as deleted")
	got, err := c.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp != nil || got.Status.Phase != corev1.VolumeReleased {
		t.Fatalf("PV %s after DeleteVolume answered NotFound: %v, %+v; want it kept Released", pv.Name, err, got)
	}

	// What the Warning says to do once the volume is known to be gone.
	patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
	if _, err := c.CoreV1().PersistentVolumes().Patch(t.Context(), pv.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "the library's finalizer not removed from a Retain PV", func(ctx context.Context) (bool, error) {
		got, err := c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return err == nil && !slices.Contains(got.Finalizers, "external-provisioner.volume.kubernetes.io/finalizer"), err
	})
	if err := c.CoreV1().PersistentVolumes().Delete(t.Context(), pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "PV "+pv.Name+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return err != nil, ignoreNotFound(err)
	})
	for _, id := range d.deleted() {
		if id != pv.Spec.CSI.VolumeHandle {
			t.Errorf("DeleteVolume for %q, want only %q", id, pv.Spec.CSI.VolumeHandle)
		}
	}
}

// TestDriverAnswerNoVolumeCanRecord: a driver with topology whose answers
// make a PV the API server refuses: a topology segment key that is not a
// label key for one class, a volume_context of 1.6 MiB (etcd's default
// request limit is 1.5 MiB; CSI allows 4 KiB) for another. Each volume is
// deleted again and its claim gets a Warning saying why, where the PV's
// save was retried in the background with nothing on the claim; once the
// driver answers well, both claims are bound.
func TestDriverAnswerNoVolumeCanRecord(t *testing.T) {
	cp := controlplane.Need(t, shared)
	c := cp.Client()
	ns := generatedNamespace(t, c, "unrecordable-")
	node := ns + "-node"
	var fixed atomic.Bool
	d := &buggyDriver{
		controllerDriver: controllerDriver{name: ns + ".buggy.csi.kube-storage.io", topology: true},
		create: func(req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
			vol := &csi.Volume{
				VolumeId:           "vol-" + req.GetName(),
				CapacityBytes:      req.GetCapacityRange().GetRequiredBytes(),
				AccessibleTopology: []*csi.Topology{{Segments: map[string]string{e2e.TopologyKey: node}}},
			}
			switch {
			case fixed.Load():
			case req.GetParameters()["answer"] == "topology":
				vol.AccessibleTopology = []*csi.Topology{{Segments: map[string]string{"zone a": node}}}
			case req.GetParameters()["answer"] == "context":
				vol.VolumeContext = map[string]string{"blob": strings.Repeat("x", 1600*1024)}
			}
			return &csi.CreateVolumeResponse{Volume: vol}, nil
		},
	}
	s := startBuggy(t, cp, ns, d)
	s.node(d.name, node)
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, tc := range []struct{ answer, fragment string }{
		{"topology", `accessible_topology segment key "zone a" is not a label key`},
		{"context", "its PersistentVolume would take 1638"},
	} {
		sc := testutil.CreateClass(t, c, testutil.NewSC(ns+"-"+tc.answer, d.name).Param("answer", tc.answer).Obj())
		claim := s.claim(testutil.NewPVC(ns, tc.answer).Class(sc.Name).Size("1Gi"))
		claims[tc.answer] = claim
		s.waitEvent(ns, string(claim.UID), "Warning", "ProvisioningFailed",
			`CSI driver `+d.name+` returned volume ID "vol-pvc-`+string(claim.UID)+`" that no PersistentVolume can record: `+tc.fragment)
		testutil.Eventually(t, 0, "the volume of claim "+tc.answer+" not deleted again", func(context.Context) (bool, error) {
			return slices.Contains(d.deleted(), "vol-pvc-"+string(claim.UID)), nil
		})
		if got := s.getClaim(claim.Name); got.Status.Phase != corev1.ClaimPending || !slices.Contains(got.Finalizers, inflight.Finalizer) {
			t.Fatalf("claim %s: phase %v, finalizers %v; want Pending with the in-flight finalizer", tc.answer, got.Status.Phase, got.Finalizers)
		}
	}

	fixed.Store(true)
	for name, claim := range claims {
		_, pv := s.waitBound(name)
		if pv.Spec.CSI.VolumeHandle != "vol-pvc-"+string(claim.UID) || pv.Spec.NodeAffinity == nil {
			t.Errorf("PV of claim %s: handle %q, node affinity %v", name, pv.Spec.CSI.VolumeHandle, pv.Spec.NodeAffinity)
		}
	}
}

// TestDriverNameNoVolumeCanCarry: a driver whose GetPluginInfo name has an
// underscore. No PV can name it in spec.csi.driver, so every volume
// created would stay without a PV (the PV create refused and retried in
// the background, with nothing on the claim): the sidecar exits at start
// saying why instead.
func TestDriverNameNoVolumeCanCarry(t *testing.T) {
	cp := controlplane.Need(t, shared)
	d := &buggyDriver{controllerDriver: controllerDriver{name: "my_driver.buggy.csi.kube-storage.io"}, create: func(*csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
		t.Error("CreateVolume called")
		return nil, status.Error(codes.Internal, "not expected")
	}}
	socket := serveDriver(t, d)
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	sidecar, err := e2e.StartSidecar(bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: socket, LogPath: filepath.Join(filepath.Dir(socket), "sidecar.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sidecar.Stop(10 * time.Second) })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := sidecar.WaitExit(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("the sidecar did not fail at start: %v", err)
	}
	want := `the CSI driver reports the name "my_driver.buggy.csi.kube-storage.io", which no PersistentVolume can name`
	if log := controlplane.TailFile(sidecar.LogPath, 20); !strings.Contains(log, want) {
		t.Errorf("sidecar log does not contain %q:\n%s", want, log)
	}
}
