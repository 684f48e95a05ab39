package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestCreateAndDeleteVolumeFail: the driver requires a secret for
// CreateVolume and DeleteVolume, and the secret the class names is wrong
// first. CreateVolume fails (UNAUTHENTICATED): the claim gets a Warning
// ProvisioningFailed with the driver's message and stays Pending, the
// library's failed-provisioning metric counts and the provisioning metric
// does not; once the secret is right the claim is Bound and that metric
// counts. Then the secret changes again, so DeleteVolume fails: the PV gets
// a Warning VolumeFailedDelete with the driver's message and stays
// Released, the driver keeps the volume, and the failed-deletion metric
// counts. The secret is then deleted: the event also says that DeleteVolume
// was sent without it because it could not be read. Once the secret is back
// and right the volume and the PV are deleted and the deletion metric
// counts.
func TestCreateAndDeleteVolumeFail(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{
		driverArgs:  []string{"--require-create-secret=token=abc123", "--require-delete-secret=token=abc123"},
		sidecarArgs: []string{"--http-endpoint=" + endpoint},
	})
	ctx := t.Context()
	secrets := s.c.CoreV1().Secrets(s.ns)
	sc, setToken := s.credsClass("secret", "xyz789")
	provisioned := metricSeries("controller_persistentvolumeclaim_provision_total", "class", sc.Name, "source", "")
	provisionFailed := metricSeries("controller_persistentvolumeclaim_provision_failed_total", "class", sc.Name, "source", "")
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeWarning, "ProvisioningFailed", `secret "token" has the wrong value`)
	waitMetric(t, endpoint, provisionFailed, func(n float64) bool { return n >= 1 })
	if n, err := metricValue(ctx, endpoint, provisioned); err != nil || n != 0 {
		t.Errorf("%s = %v (%v) after a failed CreateVolume only, want 0", provisioned, n, err)
	}
	if ids, err := s.driver.VolumeIDs(ctx); err != nil || len(ids) != 0 {
		t.Errorf("driver volumes = %v (%v) after a failed CreateVolume, want none", ids, err)
	}

	setToken("abc123")
	_, pv := s.waitBound(claim.Name)
	waitMetric(t, endpoint, provisioned, func(n float64) bool { return n == 1 })
	handle := pv.Spec.CSI.VolumeHandle
	deleted := metricSeries("controller_persistentvolume_delete_total", "class", sc.Name)
	failed := metricSeries("controller_persistentvolume_delete_failed_total", "class", sc.Name)

	setToken("changed")
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(metav1.NamespaceDefault, string(pv.UID), corev1.EventTypeWarning, "VolumeFailedDelete", `secret "token" has the wrong value`)
	waitMetric(t, endpoint, failed, func(n float64) bool { return n >= 1 })
	if n, err := metricValue(ctx, endpoint, deleted); err != nil || n != 0 {
		t.Errorf("%s = %v (%v) after a failed deletion only, want 0", deleted, n, err)
	}
	got, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("PV after a failed DeleteVolume: %v", err)
	}
	if got.Status.Phase != corev1.VolumeReleased {
		t.Errorf("PV phase = %s after a failed DeleteVolume, want Released", got.Status.Phase)
	}
	if ids, err := s.driver.VolumeIDs(ctx); err != nil || !slices.Equal(ids, []string{handle}) {
		t.Errorf("driver volumes = %v (%v) after a failed DeleteVolume, want %s", ids, err, handle)
	}

	// The secret is deleted: the driver's refusal alone would not say why,
	// the event names the secret that could not be read.
	if err := secrets.Delete(ctx, "creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(metav1.NamespaceDefault, string(pv.UID), corev1.EventTypeWarning, "VolumeFailedDelete",
		`sent without secrets: the deletion secret could not be read: error getting secret creds in namespace `+s.ns+`: secrets "creds" not found`)

	if _, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"token": "abc123"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, pv.Name)
	waitMetric(t, endpoint, deleted, func(n float64) bool { return n >= 1 })
}

// metricSeries is the exposition-format name of the series name with the
// labels given as name, value pairs in the order /metrics sorts them, as it
// starts a line of /metrics.
func metricSeries(name string, labels ...string) string {
	pairs := make([]string, 0, len(labels)/2)
	for i := 0; i+1 < len(labels); i += 2 {
		pairs = append(pairs, fmt.Sprintf("%s=%q", labels[i], labels[i+1]))
	}
	return name + "{" + strings.Join(pairs, ",") + "}"
}

// waitMetric waits until the value of series (see [metricSeries]) on the
// sidecar's /metrics satisfies ok.
func waitMetric(t *testing.T, endpoint, series string, ok func(float64) bool) {
	t.Helper()
	testutil.Eventually(t, 0, series+" never as expected on /metrics", func(ctx context.Context) (bool, error) {
		n, err := metricValue(ctx, endpoint, series)
		return ok(n), err
	})
}

// metricValue returns the value of series (see [metricSeries]) on the
// sidecar's /metrics, 0 when it is not there (a counter not yet
// incremented) or the sidecar does not listen yet.
func metricValue(ctx context.Context, endpoint, series string) (float64, error) {
	code, body, err := httpGet(ctx, endpoint, "/metrics")
	if err != nil || code != http.StatusOK {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, sc.Err()
}

// TestDeleteManyOnce: claims provisioned and then deleted together have
// each volume deleted exactly once. The library's own writes during a
// deletion queue the PV again, and a copy from its cache that has not seen
// its finalizer removal yet used to be deleted a second time: a second
// DeleteVolume, the PV counted deleted twice, or a PV delete that failed
// with "not found" (an "Unhandled Error" in the log and a failed deletion
// counted). Here DeleteVolume is called once per volume, the deletion
// metric counts each volume once, the failure metric not at all, and the
// log has no "Unhandled Error".
func TestDeleteManyOnce(t *testing.T) {
	const n = 50
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{memory: true, sidecarArgs: []string{"--http-endpoint=" + endpoint}})
	ctx := t.Context()
	sc := s.class("many", nil)
	for i := range n {
		s.claim(testutil.NewPVC(s.ns, fmt.Sprintf("data-%02d", i)).Class(sc.Name))
	}
	pvs := make([]string, n)
	for i := range n {
		_, pv := s.waitBound(fmt.Sprintf("data-%02d", i))
		pvs[i] = pv.Name
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, pv := range pvs {
		s.waitGone(fmt.Sprintf("data-%02d", i), pv)
	}
	deleted := metricSeries("controller_persistentvolume_delete_total", "class", sc.Name)
	waitMetric(t, endpoint, deleted, func(v float64) bool { return v >= n })
	deleteCalls := metricSeries("csi_sidecar_operations_seconds_count",
		"driver_name", s.driver.Name, "grpc_status_code", "OK", "method_name", "/csi.v1.Controller/DeleteVolume")
	for series, want := range map[string]float64{
		deleted:     n,
		deleteCalls: n,
		metricSeries("controller_persistentvolume_delete_failed_total", "class", sc.Name): 0,
	} {
		if got, err := metricValue(ctx, endpoint, series); err != nil || got != want {
			t.Errorf("%s = %v (%v), want %v", series, got, err, want)
		}
	}
	log, err := os.ReadFile(s.sidecar.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(log)) {
		if strings.Contains(line, "Unhandled Error") {
			t.Errorf("sidecar log: %s", line)
		}
	}
}

// TestDeleteVolumeClassGone: a PV without the deletion-secret annotations
// (as old provisioners wrote them) takes its deletion secret from its
// StorageClass. With the class deleted it is deleted without secrets, as
// upstream; the driver, which requires one, refuses, and the PV's Warning
// VolumeFailedDelete says that the class could not be read. Once the class
// is back (and its secret right) the volume and the PV are deleted.
func TestDeleteVolumeClassGone(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--require-delete-secret=token=abc123"}})
	ctx := t.Context()
	// Wrong until the end: a deletion that still finds the class in the
	// sidecar's cache fails too, instead of deleting the volume early.
	secret, err := s.c.CoreV1().Secrets(s.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"token": "xyz789"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	withSecret := func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":      "creds",
			"csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
		}
	}
	sc := s.class("gone", withSecret)
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		delete(cur.Annotations, "volume.kubernetes.io/provisioner-deletion-secret-name")
		delete(cur.Annotations, "volume.kubernetes.io/provisioner-deletion-secret-namespace")
		_, err = s.c.CoreV1().PersistentVolumes().Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.StorageV1().StorageClasses().Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "class not deleted", func(ctx context.Context) (bool, error) {
		_, err := s.c.StorageV1().StorageClasses().Get(ctx, sc.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), ignoreNotFound(err)
	})

	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(metav1.NamespaceDefault, string(pv.UID), corev1.EventTypeWarning, "VolumeFailedDelete",
		`sent without secrets: the storage class that names the deletion secret could not be read: storageclass.storage.k8s.io "`+sc.Name+`" not found`)

	secret.Data = map[string][]byte{"token": []byte("abc123")}
	if _, err := s.c.CoreV1().Secrets(s.ns).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	recreated := testutil.NewSC(sc.Name, s.driver.Name).Obj()
	withSecret(recreated)
	testutil.CreateClass(t, s.c, recreated)
	s.waitGone(claim.Name, pv.Name)
}

// TestForeignVolumeProvisionedByUs: a Released volume of another CSI driver
// whose pv.kubernetes.io/provisioned-by names this driver (a hand edit)
// with policy Delete. The other driver's provisioner skips it (not its
// annotation), and this one must not send its handle to its own driver:
// the PV gets a Warning VolumeFailedDelete saying what to do, and it stays,
// Released.
func TestForeignVolumeProvisionedByUs(t *testing.T) {
	s := newStack(t, stackConfig{})
	ctx := t.Context()
	// Its claim is gone: the binder releases it.
	foreign := testutil.NewPV(s.ns+"-foreign", "other.example.com").RV("").ReclaimPolicy(corev1.PersistentVolumeReclaimDelete).
		Annotation("pv.kubernetes.io/provisioned-by", s.driver.Name).ClaimRef(s.ns, "gone", "uid-of-a-deleted-claim").Obj()
	created, err := s.c.CoreV1().PersistentVolumes().Create(ctx, foreign, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if pv, err := s.c.CoreV1().PersistentVolumes().Get(ctx, foreign.Name, metav1.GetOptions{}); err == nil && len(pv.Finalizers) > 0 {
			pv.Finalizers = nil
			_, _ = s.c.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
		}
		_ = s.c.CoreV1().PersistentVolumes().Delete(ctx, foreign.Name, metav1.DeleteOptions{})
	})
	s.waitEvent(metav1.NamespaceDefault, string(created.UID), corev1.EventTypeWarning, "VolumeFailedDelete",
		"persistentvolume "+foreign.Name+" is a CSI volume of driver other.example.com, but pv.kubernetes.io/provisioned-by names "+s.driver.Name+
			": not deleting it; delete the volume with its own driver and this PersistentVolume by hand")
	got, err := s.c.CoreV1().PersistentVolumes().Get(ctx, foreign.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the foreign PV after the Warning: %v", err)
	}
	if got.Status.Phase != corev1.VolumeReleased || got.DeletionTimestamp != nil {
		t.Errorf("foreign PV phase %s, deletion %v; want Released and not deleted", got.Status.Phase, got.DeletionTimestamp)
	}
}

// TestSharedVolumeReleasedTogether: two static PVs of the driver record one
// volume (a share that two claims mount), both with reclaim policy Delete.
// While one of them is Bound the other's deletion waits, with a Warning
// naming it: deleting the volume would delete the data of the claim still
// bound. Once both are Released neither waits for the other: both PVs go,
// and DeleteVolume is sent for the volume only then.
func TestSharedVolumeReleasedTogether(t *testing.T) {
	cp := controlplane.Need(t, shared)
	c := cp.Client()
	ctx := t.Context()
	ns := generatedNamespace(t, c, "shared-vol-")
	d := &buggyDriver{controllerDriver: controllerDriver{name: ns + ".shared.csi.kube-storage.io"}, create: func(*csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
		return nil, status.Error(codes.Unimplemented, "this test's claims are bound to static volumes")
	}}
	s := startBuggy(t, cp, ns, d)
	sc := testutil.CreateClass(t, c, testutil.NewSC(ns, d.name).Obj())
	names := []string{"a", "b"}
	pvNames := map[string]string{}
	for _, name := range names {
		pv := testutil.NewPV(ns+"-"+name, d.name).Class(sc.Name).RV("").ReclaimPolicy(corev1.PersistentVolumeReclaimDelete).
			Annotation("pv.kubernetes.io/provisioned-by", d.name).ClaimRef(ns, name, "").Obj()
		pv.Spec.CSI.VolumeHandle = "share-1"
		pv.Status = corev1.PersistentVolumeStatus{}
		if _, err := c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pvNames[name] = pv.Name
		t.Cleanup(func() {
			ctx := context.Background()
			if got, err := c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{}); err == nil && len(got.Finalizers) > 0 {
				got.Finalizers = nil
				_, _ = c.CoreV1().PersistentVolumes().Update(ctx, got, metav1.UpdateOptions{})
			}
			_ = c.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
		})
		s.claim(testutil.NewPVC(ns, name).Class(sc.Name).Size("1Gi").VolumeName(pv.Name))
	}
	for _, name := range names {
		s.waitBound(name)
	}

	if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pvA, err := c.CoreV1().PersistentVolumes().Get(ctx, pvNames["a"], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.waitEvent(metav1.NamespaceDefault, string(pvA.UID), corev1.EventTypeWarning, "VolumeFailedDelete",
		"persistentvolume "+pvNames["b"]+" of driver "+d.name+" records the same volume")
	if got := d.deleted(); len(got) != 0 {
		t.Fatalf("DeleteVolume calls %q while claim b is bound to the volume", got)
	}

	s.deleteAndWaitClaimOnly("b", pvNames["b"])
	testutil.Eventually(t, 0, "PV "+pvNames["a"]+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().PersistentVolumes().Get(ctx, pvNames["a"], metav1.GetOptions{})
		return ignoreNotFound(err) == nil && err != nil, ignoreNotFound(err)
	})
	// Each PV's deletion sends DeleteVolume (as upstream does); the second
	// finds the volume gone, which CSI answers OK.
	got := d.deleted()
	if len(got) == 0 || slices.ContainsFunc(got, func(id string) bool { return id != "share-1" }) {
		t.Errorf("DeleteVolume calls %q, want only share-1", got)
	}
}
