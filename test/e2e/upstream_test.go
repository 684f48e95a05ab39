package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// The tests in this file replay scenarios of upstream bug reports against
// this sidecar (README, "Upstream issues checked").

// libraryFinalizer is the PV finalizer of upstream's library, which this
// sidecar keeps.
const libraryFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// TestPVDeletedWhileBound (external-provisioner issue #546, library issue
// #42): an administrator deletes the PV of a Bound claim first. The PV
// stays Terminating (the library's finalizer), the claim stays Bound and
// the volume stays. When the claim is deleted afterwards, the PV is
// Released, DeleteVolume is sent and the PV goes: the volume does not leak
// because the PV was already being deleted.
func TestPVDeletedWhileBound(t *testing.T) {
	s := newStack(t, stackConfig{})
	ctx := t.Context()
	sc := s.class("fast", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	if !slices.Contains(pv.Finalizers, libraryFinalizer) {
		t.Fatalf("PV %s finalizers = %v, want %s", pv.Name, pv.Finalizers, libraryFinalizer)
	}

	if err := s.c.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("PV %s gone at once though it carries %s: %v", pv.Name, libraryFinalizer, err)
	}
	if got.DeletionTimestamp == nil {
		t.Fatalf("PV %s not being deleted: %+v", pv.Name, got.ObjectMeta)
	}
	if ids, err := s.driver.VolumeIDs(ctx); err != nil || !slices.Equal(ids, []string{pv.Spec.CSI.VolumeHandle}) {
		t.Errorf("driver volumes = %v (%v) while the claim is Bound, want %s", ids, err, pv.Spec.CSI.VolumeHandle)
	}
	if c := s.getClaim(claim.Name); c.Status.Phase != corev1.ClaimBound {
		t.Errorf("claim phase = %s while its PV is Terminating, want Bound", c.Status.Phase)
	}

	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestPVDeleteWithAttacherFinalizer (external-provisioner issue #1217): the
// PV also carries another controller's finalizer, as external-attacher
// adds. Deleting the claim deletes the volume and the PV, and removes only
// the library's finalizer; the other one is left to its owner, and once it
// removes it the PV is gone.
func TestPVDeleteWithAttacherFinalizer(t *testing.T) {
	s := newStack(t, stackConfig{})
	ctx := t.Context()
	sc := s.class("fast", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	attacher := "external-attacher/" + s.driver.Name
	setFinalizers := func(change func([]string) []string) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Finalizers = change(cur.Finalizers)
			_, err = s.c.CoreV1().PersistentVolumes().Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	setFinalizers(func(f []string) []string { return append(f, attacher) })

	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitClaimGone(claim.Name, "claim "+claim.Name+" not deleted")
	var last *corev1.PersistentVolume
	testutil.Eventually(t, 0, "PV "+pv.Name+" not left with the attacher's finalizer only", func(ctx context.Context) (bool, error) {
		var err error
		last, err = s.c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return err == nil && last.DeletionTimestamp != nil && slices.Equal(last.Finalizers, []string{attacher}), err
	})
	if ids, err := s.driver.VolumeIDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("driver volumes = %v (%v) once the PV is being deleted, want none", ids, err)
	}

	setFinalizers(func([]string) []string { return nil })
	s.waitGone(claim.Name, pv.Name)
}

// TestCreateVolumeTimedOutThenClaimDeleted (external-provisioner issues
// #131 and #311): every CreateVolume times out (the driver keeps working
// on the volume) until the claim is deleted; the driver then answers the
// next, identical, call. The deleted claim stays until that answer, its
// volume gets a PV, and that PV is deleted with its volume: one
// DeleteVolume for the ID the driver returned, nothing leaked.
func TestCreateVolumeTimedOutThenClaimDeleted(t *testing.T) {
	cp := controlplane.Need(t, shared)
	c := cp.Client()
	ns := generatedNamespace(t, c, "create-timeout-")
	s := &stack{t: t, cp: cp, c: c, ns: ns}
	driverName := ns + ".mock.csi.kube-storage.io"
	socket := filepath.Join(t.TempDir(), "csi.sock")

	controller, srv := newMockDriver(t, driverName)

	var (
		mu       sync.Mutex
		answer   bool // set once the claim is deleted
		timedOut int
		names    []string
		deleted  []string
	)
	started := make(chan struct{}, 1)
	controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).AnyTimes().
		DoAndReturn(func(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
			mu.Lock()
			names = append(names, req.GetName())
			ok := answer
			mu.Unlock()
			if ok {
				return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-1", CapacityBytes: 1 << 30}}, nil
			}
			select {
			case started <- struct{}{}:
			default:
			}
			<-ctx.Done() // the sidecar's --timeout
			mu.Lock()
			timedOut++
			mu.Unlock()
			return nil, status.FromContextError(ctx.Err()).Err()
		})
	controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).AnyTimes().
		DoAndReturn(func(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			deleted = append(deleted, req.GetVolumeId())
			return &csi.DeleteVolumeResponse{}, nil
		})
	if err := srv.StartOnAddress("unix", socket); err != nil {
		t.Fatalf("start csi-test's mock driver on %s: %v", socket, err)
	}
	t.Cleanup(srv.Stop)
	startSidecarFor(t, cp, socket, "--timeout=1s", "--retry-interval-start=200ms", "--retry-interval-max=1s")

	sc := testutil.CreateClass(t, c, testutil.NewSC(ns, driverName).Obj())
	pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), testutil.NewPVC(ns, "data").Class(sc.Name).Size("1Gi").RV("").Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	testutil.Eventually(t, 0, "no CreateVolume timed out", func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return timedOut > 0, nil
	})
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), pvc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := s.getClaim(pvc.Name); got.DeletionTimestamp == nil {
		t.Fatalf("claim gone while its CreateVolume timed out: %+v", got.ObjectMeta)
	}
	mu.Lock()
	answer = true
	mu.Unlock()

	s.waitClaimGone(pvc.Name, "claim "+pvc.Name+" not deleted")
	testutil.Eventually(t, 0, "vol-1 not deleted", func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(deleted) > 0, nil
	})
	testutil.Eventually(t, 0, "PV of the claim left", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().PersistentVolumes().Get(ctx, "pvc-"+string(pvc.UID), metav1.GetOptions{})
		return err != nil, ignoreNotFound(err)
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(deleted, []string{"vol-1"}) {
		t.Errorf("DeleteVolume calls = %q, want one for vol-1", deleted)
	}
	for _, n := range names {
		if n != "pvc-"+string(pvc.UID) {
			t.Errorf("CreateVolume name %q, want pvc-%s each time", n, pvc.UID)
		}
	}
}
