package integration

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T, cp *controlplane.ControlPlane) string {
	t.Helper()
	ns, err := cp.Client().CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "it-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// TestHarnessObjects creates a StorageClass, a PVC and a CSI PV through
// client-go and watches them arrive.
func TestHarnessObjects(t *testing.T) {
	cp := controlplane.Need(t, shared)
	ctx := t.Context()
	c := cp.Client()
	ns := newNamespace(t, cp)

	w, err := c.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// Named after the namespace, and deleted at the end: the class is
	// cluster-scoped and the control plane is shared (go test -count=N).
	sc := testutil.CreateClass(t, c, testutil.NewSC(ns+"-sc", "harness.csi.example").Obj())
	pvc := testutil.NewPVC(ns, "claim").Class(sc.Name).RV("").Obj()
	created, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := testutil.NewPV("harness-pv-"+ns, "harness.csi.example").Class(sc.Name).RV("").Obj()
	pv.Status = corev1.PersistentVolumeStatus{}
	gotPV, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.CoreV1().PersistentVolumes().Delete(context.Background(), gotPV.Name, metav1.DeleteOptions{})
	})
	if gotPV.Spec.CSI == nil || gotPV.Spec.CSI.Driver != "harness.csi.example" {
		t.Errorf("PV CSI source = %+v", gotPV.Spec.CSI)
	}

	select {
	case ev := <-w.ResultChan():
		got, ok := ev.Object.(*corev1.PersistentVolumeClaim)
		if ev.Type != watch.Added || !ok || got.UID != created.UID {
			t.Fatalf("first watch event = %s %T, want ADDED of the claim", ev.Type, ev.Object)
		}
	case <-time.After(time.Minute):
		t.Fatal("no watch event for the created claim")
	}
	// Admission added the protection finalizer that the controller must remove on delete.
	if len(created.Finalizers) == 0 || created.Finalizers[0] != "kubernetes.io/pvc-protection" {
		t.Errorf("claim finalizers = %v, want kubernetes.io/pvc-protection from admission", created.Finalizers)
	}
}

// TestHarnessClaimDeletion deletes a claim and sees it gone: the PVC
// protection controller of kube-controller-manager removes its finalizer.
func TestHarnessClaimDeletion(t *testing.T) {
	cp := controlplane.Need(t, shared)
	ctx := t.Context()
	c := cp.Client()
	ns := newNamespace(t, cp)
	pvc := testutil.NewPVC(ns, "doomed").RV("").Obj()
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, pvc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "claim still exists after delete", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// TestHarnessControllerManagerBinder starts a control plane whose
// kube-controller-manager also runs the PV binder, and sees it bind a static
// PV to a claim: the coexistence harness works.
func TestHarnessControllerManagerBinder(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		Controllers: append([]string{controlplane.PVBinderController}, controlplane.DefaultControllers...),
	})
	ctx := t.Context()
	c := cp.Client()
	ns := newNamespace(t, cp)
	pv := testutil.NewPV("static-pv", "harness.csi.example").Class("").RV("").Obj()
	pv.Status = corev1.PersistentVolumeStatus{}
	if _, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := testutil.NewPVC(ns, "claim").Class("").RV("").Obj()
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "kube-controller-manager did not bind the static PV", func(ctx context.Context) (bool, error) {
		got, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == pv.Name, nil
	})
}
