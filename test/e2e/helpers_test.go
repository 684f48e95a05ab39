package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// waitForFirstConsumer makes a class of stack.class delay binding.
func waitForFirstConsumer(sc *storagev1.StorageClass) {
	m := storagev1.VolumeBindingWaitForFirstConsumer
	sc.VolumeBindingMode = &m
}

// waitCreateVolumeStarted waits until the driver has one volume: with a
// driver slowed by --create-latency, the claim's CreateVolume is then in
// flight, and no PV exists for claim yet (checked).
func (s *stack) waitCreateVolumeStarted(claim *corev1.PersistentVolumeClaim) {
	s.t.Helper()
	testutil.Eventually(s.t, 0, "CreateVolume not started", func(ctx context.Context) (bool, error) {
		vols, err := s.driver.ListVolumes(ctx)
		return len(vols) == 1, err
	})
	if pv := s.pvOf(claim.UID); pv != nil {
		s.t.Fatalf("PV %s exists while its CreateVolume should be in flight; the test did not hit the window", pv.Name)
	}
}

// kill SIGKILLs the sidecar and waits until it exited.
func (s *stack) kill() {
	s.t.Helper()
	if err := s.sidecar.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatal(err)
	}
	if err := s.sidecar.WaitExit(s.t.Context()); err == nil {
		s.t.Fatal("sidecar exited cleanly after SIGKILL")
	}
}

// pvOf returns the PV whose claimRef carries uid, nil if none.
func (s *stack) pvOf(uid types.UID) *corev1.PersistentVolume {
	s.t.Helper()
	pvs, err := s.c.CoreV1().PersistentVolumes().List(s.t.Context(), metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	for i := range pvs.Items {
		if ref := pvs.Items[i].Spec.ClaimRef; ref != nil && ref.UID == uid {
			return &pvs.Items[i]
		}
	}
	return nil
}

// checkOnDriverNode fails unless pv's node affinity is exactly the
// driver's node: one term, TopologyKey in [NodeID].
func (s *stack) checkOnDriverNode(pv *corev1.PersistentVolume) {
	s.t.Helper()
	aff := pv.Spec.NodeAffinity
	if aff == nil || aff.Required == nil || len(aff.Required.NodeSelectorTerms) != 1 {
		s.t.Fatalf("node affinity = %+v", aff)
	}
	exprs := aff.Required.NodeSelectorTerms[0].MatchExpressions
	if len(exprs) != 1 || exprs[0].Key != e2e.TopologyKey || !slices.Equal(exprs[0].Values, []string{s.driver.NodeID}) {
		s.t.Errorf("node affinity expressions = %+v, want %s in [%s]", exprs, e2e.TopologyKey, s.driver.NodeID)
	}
}

// generatedNamespace creates a namespace named prefix plus a random suffix
// and returns its name.
func generatedNamespace(t *testing.T, c kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// startSidecarFor starts the sidecar against a driver that the test serves
// from its own process on socket, and waits until it provisions. When t
// ends it stops the sidecar and checks its log ([e2e.CheckLog]); the caller
// registers the driver's stop before calling it, so that the sidecar stops
// first (it exits when it loses its driver).
func startSidecarFor(t *testing.T, cp *controlplane.ControlPlane, socket string, args ...string) *e2e.Sidecar {
	t.Helper()
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(filepath.Dir(socket), "sidecar.log")
	sidecar, err := e2e.StartSidecar(bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: socket, LogPath: logPath, Args: args,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sidecar.Stop(10 * time.Second)
		e2e.CheckLog(t, sidecar.LogPath)
		if t.Failed() {
			t.Logf("sidecar log:\n%s", controlplane.TailFile(sidecar.LogPath, 60))
		}
	})
	if err := sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	return sidecar
}
