// Command demo is `make demo`: it starts a local control plane (etcd,
// kube-apiserver and kube-controller-manager's protection controllers only,
// so the sidecar's own binder does the binding), the example hostpath driver
// and the csi-provisioner sidecar, then provisions, binds and deletes a
// volume, then shows a claim that waits for a missing secret with the
// Warning that explains it, and shows each step. With --keep it leaves everything running and
// prints a KUBECONFIG line.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

func main() {
	binDir := flag.String("bin-dir", "", "directory with csi-provisioner and hostpath-driver (default: build them)")
	keep := flag.Bool("keep", false, "leave the control plane, driver and sidecar running until Ctrl-C")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *binDir, *keep); err != nil {
		fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
		os.Exit(1)
	}
}

// step prints a numbered step with the time since the start.
type stepper struct {
	w     io.Writer
	start time.Time
	n     int
}

func (s *stepper) step(format string, args ...any) {
	s.n++
	fmt.Fprintf(s.w, "\n[%2d] %6.2fs  %s\n", s.n, time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, out io.Writer, binDir string, keep bool) error {
	s := &stepper{w: out, start: time.Now()}
	bins, err := e2e.Build(ctx, binDir)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "csi-provisioner-demo-")
	if err != nil {
		return err
	}
	// With --keep too: Ctrl-C stops every process, and what is left in the
	// directory (etcd's data, certificates, logs) serves nothing then.
	defer func() { _ = os.RemoveAll(dir) }()

	s.step("Starting a local control plane: etcd, kube-apiserver, and kube-controller-manager with only the PVC/PV protection controllers (no PV binder: the sidecar binds)")
	cp, err := controlplane.Start(ctx, controlplane.Config{Dir: filepath.Join(dir, "controlplane")})
	if err != nil {
		return err
	}
	defer func() { _ = cp.Stop() }()
	fmt.Fprintf(out, "      kube-apiserver %s at %s\n", cp.Binaries.KubernetesVersion, cp.URL)

	s.step("Starting the example hostpath CSI driver (volumes are directories under %s)", filepath.Join(dir, "driver-root"))
	driver, err := e2e.StartDriver(ctx, bins.Driver, e2e.DriverConfig{Dir: dir})
	if err != nil {
		return err
	}
	defer func() { _ = driver.Stop(5 * time.Second) }()

	s.step("Starting csi-provisioner --csi-address=%s", driver.Socket)
	sidecar, err := e2e.StartSidecar(bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: driver.Socket, LogPath: filepath.Join(dir, "csi-provisioner.log"),
		Args: []string{"--http-endpoint=127.0.0.1:0", "-v=2"},
	})
	if err != nil {
		return err
	}
	defer func() { _ = sidecar.Stop(10 * time.Second) }()
	if err := sidecar.WaitLog(ctx, "Started provisioner controller"); err != nil {
		return err
	}
	fmt.Fprintf(out, "      log: %s\n", sidecar.LogPath)

	c := cp.Client()
	const ns = "demo"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	sc := testutil.NewSC("hostpath", driver.Name).Obj()
	sc.ResourceVersion, sc.UID = "", ""
	s.step("Creating StorageClass %q (provisioner %s, reclaimPolicy Delete, volumeBindingMode Immediate)", sc.Name, sc.Provisioner)
	if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		return err
	}
	pvc := testutil.NewPVC(ns, "data").Class(sc.Name).Size("1Gi").RV("").Obj()
	s.step("Creating PersistentVolumeClaim %s/%s (1Gi, ReadWriteOnce)", ns, pvc.Name)
	created, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	createdAt := time.Now() // creationTimestamp has whole seconds only

	bound, err := waitBound(ctx, c, ns, pvc.Name)
	if err != nil {
		return fmt.Errorf("%w; sidecar log:\n%s", err, controlplane.TailFile(sidecar.LogPath, 30))
	}
	s.step("The claim is Bound, %.3fs after it was created", time.Since(createdAt).Seconds())
	now := time.Now()
	e2e.PrintPVCs(out, now, bound)
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, bound.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	e2e.PrintPVs(out, now, pv)
	fmt.Fprintf(out, "\n      PV %s: csi.driver=%s volumeHandle=%s, finalizers %v\n", pv.Name, pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle, pv.Finalizers)
	fmt.Fprintln(out)
	printEvents(ctx, out, c, ns, string(created.UID))
	vols, err := driver.ListVolumes(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\n      The driver's volumes (CSI ListVolumes):")
	e2e.PrintCSIVolumes(out, vols)

	if keep {
		s.step("Leaving everything running. Try your own claims with:")
		fmt.Fprintf(out, "\n    export KUBECONFIG=%s\n\n    (the StorageClass is %q; sidecar log: %s)\n    Press Ctrl-C to stop.\n", cp.KubeconfigPath, sc.Name, sidecar.LogPath)
		<-ctx.Done()
		return nil
	}

	s.step("Deleting the claim; the binder releases the PV and the sidecar deletes the volume and the PV (reclaimPolicy Delete)")
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, pvc.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	deleted := time.Now()
	if err := waitGone(ctx, c, pv.Name); err != nil {
		return fmt.Errorf("%w; sidecar log:\n%s", err, controlplane.TailFile(sidecar.LogPath, 30))
	}
	s.step("PV %s is gone, %.3fs after the claim was deleted", pv.Name, time.Since(deleted).Seconds())
	pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "      PersistentVolumes left: %d\n", len(pvs.Items))
	vols, err = driver.ListVolumes(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "      The driver's volumes (CSI ListVolumes):")
	e2e.PrintCSIVolumes(out, vols)
	if len(vols) != 0 {
		return fmt.Errorf("the driver still has %d volumes", len(vols))
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "      Events about the PV (a release and a deletion that succeed record none):")
	printEvents(ctx, out, c, "", pv.Name)

	if err := explainPending(ctx, s, c, ns, driver); err != nil {
		return fmt.Errorf("%w; sidecar log:\n%s", err, controlplane.TailFile(sidecar.LogPath, 30))
	}

	s.step("Stopping the sidecar, the driver and the control plane")
	return nil
}

// explainPending shows a claim that cannot be provisioned yet: its class
// names a provisioner secret that does not exist. The claim stays Pending
// with a Warning event that says why; once the secret exists, the sidecar's
// next retry provisions it. Then the claim is deleted with its volume.
func explainPending(ctx context.Context, s *stepper, c kubernetes.Interface, ns string, driver *e2e.Driver) error {
	const secretName = "backend-credentials"
	sc := testutil.NewSC("hostpath-with-secret", driver.Name).
		Param("csi.storage.k8s.io/provisioner-secret-name", secretName).
		Param("csi.storage.k8s.io/provisioner-secret-namespace", ns).Obj()
	sc.ResourceVersion, sc.UID = "", ""
	pvc := testutil.NewPVC(ns, "data-2").Class(sc.Name).Size("1Gi").RV("").Obj()
	s.step("Creating StorageClass %q, whose provisioner secret %s/%s does not exist yet, and PersistentVolumeClaim %s/%s of it", sc.Name, ns, secretName, ns, pvc.Name)
	if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		return err
	}
	created, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	createdAt := time.Now()
	sel := "involvedObject.uid=" + string(created.UID) + ",type=" + corev1.EventTypeWarning
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		return err == nil && len(list.Items) > 0, err
	}); err != nil {
		return fmt.Errorf("no Warning event on the claim that waits for its secret: %w", err)
	}
	pending, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if pending.Status.Phase == corev1.ClaimBound {
		return fmt.Errorf("claim %s/%s was Bound without its provisioner secret", ns, pvc.Name)
	}
	s.step("The claim is %s, and its events say why (%.3fs after it was created)", pending.Status.Phase, time.Since(createdAt).Seconds())
	e2e.PrintPVCs(s.w, time.Now(), pending)
	fmt.Fprintln(s.w)
	printEvents(ctx, s.w, c, ns, string(created.UID))

	s.step("Creating Secret %s/%s; the sidecar provisions the claim at its next retry (--retry-interval-start 1s, doubling)", ns, secretName)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName}, StringData: map[string]string{"token": "demo"}}
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return err
	}
	secretAt := time.Now()
	bound, err := waitBound(ctx, c, ns, pvc.Name)
	if err != nil {
		return err
	}
	s.step("The claim is Bound, %.3fs after the Secret was created", time.Since(secretAt).Seconds())
	e2e.PrintPVCs(s.w, time.Now(), bound)
	fmt.Fprintln(s.w)
	printEvents(ctx, s.w, c, ns, string(created.UID))

	s.step("Deleting that claim too")
	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, pvc.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := waitGone(ctx, c, bound.Spec.VolumeName); err != nil {
		return err
	}
	vols, err := driver.ListVolumes(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(s.w, "      PV %s is gone; the driver has %d volumes\n", bound.Spec.VolumeName, len(vols))
	if len(vols) != 0 {
		return fmt.Errorf("the driver still has %d volumes", len(vols))
	}
	return nil
}

// waitBound waits up to a minute for the claim to be Bound and returns it.
func waitBound(ctx context.Context, c kubernetes.Interface, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	var claim *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		claim, err = c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && claim.Status.Phase == corev1.ClaimBound, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s not Bound: %w", ns, name, err)
	}
	return claim, nil
}

// waitGone waits up to a minute for the PV to be deleted.
func waitGone(ctx context.Context, c kubernetes.Interface, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		return fmt.Errorf("PV %s not deleted: %w", name, err)
	}
	return nil
}

// printEvents prints the events of namespace ns about the object with the
// given UID, or cluster-wide events about the object named name when ns is "".
func printEvents(ctx context.Context, out io.Writer, c kubernetes.Interface, ns, uidOrName string) {
	sel := "involvedObject.uid=" + uidOrName
	if ns == "" {
		sel = "involvedObject.name=" + uidOrName
	}
	list, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		fmt.Fprintf(out, "      (cannot list events: %v)\n", err)
		return
	}
	e2e.PrintEvents(out, time.Now(), list.Items)
}
