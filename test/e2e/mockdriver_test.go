package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestMockDriver runs the real sidecar against csi-test's mock CSI driver
// (gomock servers in this test process, on a unix socket) and a real
// kube-apiserver. It is the model for a driver author who wants to see
// exactly what the sidecar sends and how it treats each answer without
// writing a driver: the expectations below are the requests the sidecar
// makes for one claim whose first CreateVolume fails, and what the user
// sees of it.
func TestMockDriver(t *testing.T) {
	cp := controlplane.Need(t, shared)
	c := cp.Client()
	ns := generatedNamespace(t, c, "mock-driver-")
	s := &stack{t: t, cp: cp, c: c, ns: ns}
	driverName := ns + ".mock.csi.kube-storage.io"
	socket := filepath.Join(t.TempDir(), "csi.sock")

	controller, srv := newMockDriver(t, driverName)

	// Provisioning: the first CreateVolume finds the pool full, the
	// second (the sidecar's retry, with the same name) succeeds with more
	// than was asked; then exactly one DeleteVolume.
	var (
		mu       sync.Mutex
		requests []*csi.CreateVolumeRequest
		deleted  []string
	)
	record := func(req *csi.CreateVolumeRequest) {
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, proto.Clone(req).(*csi.CreateVolumeRequest))
	}
	gomock.InOrder(
		controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
			DoAndReturn(func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
				record(req)
				return nil, status.Error(codes.ResourceExhausted, "pool-a is full")
			}),
		controller.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
			DoAndReturn(func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
				record(req)
				return &csi.CreateVolumeResponse{Volume: &csi.Volume{
					VolumeId: "vol-1", CapacityBytes: 2 << 30, VolumeContext: map[string]string{"pool": "a"},
				}}, nil
			}),
	)
	controller.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).
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
	// Registered after srv.Stop, so the sidecar stops first.
	startSidecarFor(t, cp, socket, "-v=4", "--retry-interval-start=200ms")

	sc := testutil.CreateClass(t, c, testutil.NewSC(ns, driverName).Param("pool", "a").Obj())
	pvc := testutil.NewPVC(ns, "data").Class(sc.Name).Size("1Gi").RV("").Obj()
	pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var bound *corev1.PersistentVolumeClaim
	testutil.Eventually(t, 0, "claim not Bound", func(ctx context.Context) (bool, error) {
		bound, err = c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc.Name, metav1.GetOptions{})
		return err == nil && bound.Status.Phase == corev1.ClaimBound, err
	})

	// What the driver was asked, twice alike.
	mu.Lock()
	got := requests
	mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("CreateVolume calls = %d, want 2", len(got))
	}
	want := &csi.CreateVolumeRequest{
		Name:          "pvc-" + string(pvc.UID),
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Parameters: map[string]string{"pool": "a"},
	}
	for i, req := range got {
		if !proto.Equal(req, want) {
			t.Errorf("CreateVolume #%d:\n got %v\nwant %v", i+1, req, want)
		}
	}

	// What the user sees: the failure explained on the claim, then a PV
	// with the driver's answer.
	s.waitEvent(ns, string(pvc.UID), "Warning", "ProvisioningFailed", "pool-a is full")
	s.waitEvent(ns, string(pvc.UID), "Normal", "ProvisioningSucceeded", "")
	pv, err := c.CoreV1().PersistentVolumes().Get(t.Context(), bound.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pv.Spec.CSI; got == nil || got.Driver != driverName || got.VolumeHandle != "vol-1" || got.VolumeAttributes["pool"] != "a" {
		t.Errorf("PV CSI source = %+v, want driver %s, handle vol-1, attribute pool=a", got, driverName)
	}
	if size := pv.Spec.Capacity[corev1.ResourceStorage]; size.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("PV capacity = %s, want the 2Gi the driver returned", size.String())
	}

	// Deletion: one DeleteVolume with the driver's own ID, then no PV.
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), pvc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "PV "+pv.Name+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return ignoreNotFound(err) == nil && err != nil, ignoreNotFound(err)
	})
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(deleted) != "[vol-1]" {
		t.Errorf("DeleteVolume calls = %q, want one for vol-1", deleted)
	}
}

// mockReporter reports gomock's findings to t. gomock calls it on the gRPC
// server's goroutines, where t.Fatalf must not be called, so Fatalf marks
// the test failed and ends only the call's goroutine: the sidecar sees no
// answer and times out the call.
type mockReporter struct{ t *testing.T }

func (r mockReporter) Errorf(format string, args ...any) { r.t.Errorf(format, args...) }
func (r mockReporter) Fatalf(format string, args ...any) {
	r.t.Errorf(format, args...)
	runtime.Goexit()
}
func (r mockReporter) Helper()          { r.t.Helper() }
func (r mockReporter) Cleanup(f func()) { r.t.Cleanup(f) }

// newMockDriver returns csi-test's mock driver, not started, as a
// controller-only driver named name that creates and deletes volumes, and
// its controller service for the test's expectations. Its answers to the
// discovery calls are set: the sidecar asks once at start (and Probe again
// for /readyz); AnyTimes keeps a test about provisioning.
func newMockDriver(t *testing.T, name string) (*driver.MockControllerServer, *driver.MockCSIDriver) {
	ctrl := gomock.NewController(mockReporter{t})
	identity := driver.NewMockIdentityServer(ctrl)
	controller := driver.NewMockControllerServer(ctrl)
	// csi-test registers every service, also one given as nil, and a call
	// to a nil one would panic in the gRPC server: give all three.
	srv := driver.NewMockCSIDriver(&driver.MockCSIDriverServers{
		Identity: identity, Controller: controller, Node: driver.NewMockNodeServer(ctrl),
	})
	identity.EXPECT().GetPluginInfo(gomock.Any(), gomock.Any()).
		Return(&csi.GetPluginInfoResponse{Name: name, VendorVersion: "0.0.1"}, nil).AnyTimes()
	identity.EXPECT().Probe(gomock.Any(), gomock.Any()).
		Return(&csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil).AnyTimes()
	identity.EXPECT().GetPluginCapabilities(gomock.Any(), gomock.Any()).Return(controllerPluginCapabilities(), nil).AnyTimes()
	controller.EXPECT().ControllerGetCapabilities(gomock.Any(), gomock.Any()).Return(createDeleteCapabilities(), nil).AnyTimes()
	return controller, srv
}
