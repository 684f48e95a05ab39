package e2e

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

const pvFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// TestProvisionBindDelete: a claim becomes Bound to a PV with the fields
// upstream writes; deleting the claim deletes the volume in the driver and
// the PV.
func TestProvisionBindDelete(t *testing.T) {
	s := newStack(t, stackConfig{})
	sc := s.class("fs", func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{"csi.storage.k8s.io/fstype": "ext4", "color": "blue"}
		sc.MountOptions = []string{"noatime"}
	})
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Size("2Gi"))
	pvc, pv := s.waitBound(claim.Name)

	if want := "pvc-" + string(claim.UID); pv.Name != want {
		t.Errorf("PV name = %s, want %s", pv.Name, want)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != claim.UID || ref.Name != claim.Name || ref.Namespace != s.ns {
		t.Errorf("claimRef = %+v, want the claim with its UID", ref)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != s.driver.Name || pv.Spec.CSI.VolumeHandle == "" || pv.Spec.CSI.FSType != "ext4" {
		t.Errorf("CSI source = %+v", pv.Spec.CSI)
	}
	if pv.Spec.CSI != nil && pv.Spec.CSI.VolumeAttributes["storage.kubernetes.io/csiProvisionerIdentity"] == "" {
		t.Errorf("volumeAttributes lack the provisioner identity: %v", pv.Spec.CSI.VolumeAttributes)
	}
	if pv.Annotations["pv.kubernetes.io/provisioned-by"] != s.driver.Name {
		t.Errorf("provisioned-by = %q", pv.Annotations["pv.kubernetes.io/provisioned-by"])
	}
	for _, k := range []string{"volume.kubernetes.io/provisioner-deletion-secret-name", "volume.kubernetes.io/provisioner-deletion-secret-namespace"} {
		if _, ok := pv.Annotations[k]; !ok {
			t.Errorf("PV lacks annotation %s", k)
		}
	}
	if !slices.Contains(pv.Finalizers, pvFinalizer) {
		t.Errorf("PV finalizers = %v, want %s", pv.Finalizers, pvFinalizer)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Spec.StorageClassName != sc.Name {
		t.Errorf("reclaim policy %s, class %s", pv.Spec.PersistentVolumeReclaimPolicy, pv.Spec.StorageClassName)
	}
	if !slices.Equal(pv.Spec.MountOptions, []string{"noatime"}) {
		t.Errorf("mount options = %v", pv.Spec.MountOptions)
	}
	if q := pv.Spec.Capacity[corev1.ResourceStorage]; q.Cmp(resource.MustParse("2Gi")) < 0 {
		t.Errorf("PV capacity %s < 2Gi", q.String())
	}
	if pv.Status.Phase != corev1.VolumeBound {
		t.Errorf("PV phase = %s", pv.Status.Phase)
	}
	if pvc.Annotations["pv.kubernetes.io/bind-completed"] != "yes" || pvc.Annotations["pv.kubernetes.io/bound-by-controller"] != "yes" {
		t.Errorf("claim annotations = %v", pvc.Annotations)
	}
	if pvc.Annotations["volume.kubernetes.io/storage-provisioner"] != s.driver.Name {
		t.Errorf("storage-provisioner annotation = %q", pvc.Annotations["volume.kubernetes.io/storage-provisioner"])
	}
	if inflight.Has(pvc) {
		t.Errorf("bound claim still has the in-flight finalizer: %v", pvc.Finalizers)
	}
	if q := pvc.Status.Capacity[corev1.ResourceStorage]; q.Cmp(resource.MustParse("2Gi")) < 0 {
		t.Errorf("claim status capacity %s", q.String())
	}
	vols, err := s.driver.ListVolumes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 || vols[0].GetVolumeId() != pv.Spec.CSI.VolumeHandle {
		t.Errorf("driver volumes = %v, want the PV's handle %s", vols, pv.Spec.CSI.VolumeHandle)
	}
	// The library's event, through the sidecar's own event client and writer.
	s.waitEvent(s.ns, string(claim.UID), "Normal", "ProvisioningSucceeded", "Successfully provisioned volume "+pv.Name)
	evs := s.events(s.ns, string(claim.UID))
	for _, e := range evs {
		if strings.HasPrefix(e, "Warning") {
			t.Errorf("unexpected warning on the success path: %s", e)
		}
	}
	if len(evs) > 2 {
		t.Errorf("%d events on the success path, want at most 2: %v", len(evs), evs)
	}

	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestBlock provisions a raw block claim.
func TestBlock(t *testing.T) {
	s := newStack(t, stackConfig{})
	sc := s.class("block", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "raw").Class(sc.Name).Block())
	_, pv := s.waitBound(claim.Name)
	if pv.Spec.VolumeMode == nil || *pv.Spec.VolumeMode != corev1.PersistentVolumeBlock {
		t.Errorf("PV volumeMode = %v, want Block", pv.Spec.VolumeMode)
	}
	if pv.Spec.CSI.FSType != "" {
		t.Errorf("block PV has fsType %q", pv.Spec.CSI.FSType)
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestSecretsAndTemplates: the provisioner secret is resolved from templates,
// read and sent to the driver, which refuses creates and deletes without it;
// the other secret references land on the PV.
func TestSecretsAndTemplates(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--require-create-secret=token=abc123", "--require-delete-secret=token=abc123"}})
	for _, name := range []string{"create-data", "publish-data"} {
		_, err := s.c.CoreV1().Secrets(s.ns).Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			StringData: map[string]string{"token": "abc123"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	sc := s.class("secrets", func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":            "create-${pvc.name}",
			"csi.storage.k8s.io/provisioner-secret-namespace":       "${pvc.namespace}",
			"csi.storage.k8s.io/node-publish-secret-name":           "${pvc.annotations['example.com/publish-secret']}",
			"csi.storage.k8s.io/node-publish-secret-namespace":      "${pvc.namespace}",
			"csi.storage.k8s.io/controller-expand-secret-name":      "create-data",
			"csi.storage.k8s.io/controller-expand-secret-namespace": "${pvc.namespace}",
		}
	})
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Annotation("example.com/publish-secret", "publish-data"))
	_, pv := s.waitBound(claim.Name)
	if ref := pv.Spec.CSI.NodePublishSecretRef; ref == nil || ref.Name != "publish-data" || ref.Namespace != s.ns {
		t.Errorf("nodePublishSecretRef = %+v", ref)
	}
	if ref := pv.Spec.CSI.ControllerExpandSecretRef; ref == nil || ref.Name != "create-data" {
		t.Errorf("controllerExpandSecretRef = %+v", ref)
	}
	if pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-name"] != "create-data" ||
		pv.Annotations["volume.kubernetes.io/provisioner-deletion-secret-namespace"] != s.ns {
		t.Errorf("deletion secret annotations = %v", pv.Annotations)
	}
	// The driver refuses a DeleteVolume without the secret: the volume can
	// only be gone if the deletion secret from the PV annotations was sent.
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestWaitForFirstConsumerTopology: a WaitForFirstConsumer claim is
// provisioned only once the scheduler selected a node, on that node's
// topology, and its PV carries matching node affinity.
func TestWaitForFirstConsumerTopology(t *testing.T) {
	s := newStack(t, stackConfig{topology: true})
	ctx := t.Context()
	if err := s.driver.RegisterNode(ctx, s.c); err != nil {
		t.Fatal(err)
	}
	sc := s.class("wffc", waitForFirstConsumer)
	claim := s.claim(testutil.NewPVC(s.ns, "late").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), "Normal", "WaitForFirstConsumer", "waiting for first consumer")
	vols, err := s.driver.ListVolumes(ctx)
	if err != nil || len(vols) != 0 {
		t.Fatalf("volumes before a node was selected: %v, %v", vols, err)
	}
	s.selectNode(claim.Name, s.driver.NodeID)
	_, pv := s.waitBound(claim.Name)
	s.checkOnDriverNode(pv)
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestExtraCreateMetadata: with --extra-create-metadata CreateVolume gets
// the claim's name and namespace and the PV's name as parameters; the
// example driver returns its parameters as the volume context, so they end
// up in the PV's volumeAttributes.
func TestExtraCreateMetadata(t *testing.T) {
	s := newStack(t, stackConfig{sidecarArgs: []string{"--extra-create-metadata"}})
	sc := s.class("meta", func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{"color": "blue"}
	})
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	want := map[string]string{
		"color":                            "blue",
		"csi.storage.k8s.io/pvc/name":      claim.Name,
		"csi.storage.k8s.io/pvc/namespace": s.ns,
		"csi.storage.k8s.io/pv/name":       pv.Name,
	}
	for k, v := range want {
		if got := pv.Spec.CSI.VolumeAttributes[k]; got != v {
			t.Errorf("volumeAttributes[%s] = %q, want %q (all: %v)", k, got, v, pv.Spec.CSI.VolumeAttributes)
		}
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestBadClassParameters: a class with an unknown reserved parameter gets a
// Warning event on the claim and no volume is ever created.
func TestBadClassParameters(t *testing.T) {
	s := newStack(t, stackConfig{})
	sc := s.class("bad", func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{"csi.storage.k8s.io/no-such-key": "x"}
	})
	claim := s.claim(testutil.NewPVC(s.ns, "bad").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed", "csi.storage.k8s.io/no-such-key")
	vols, err := s.driver.ListVolumes(t.Context())
	if err != nil || len(vols) != 0 {
		t.Fatalf("driver volumes = %v, %v; want none", vols, err)
	}
	got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(t.Context(), claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.ClaimPending {
		t.Errorf("claim phase = %s", got.Status.Phase)
	}
	// Deleting it must not be blocked by the in-flight finalizer: no create was ever sent.
	s.deleteAndWaitGone(claim.Name, "")
}

// TestKillDuringCreateVolume: the sidecar is SIGKILLed while CreateVolume is
// in flight (the driver creates the volume and answers late), the claim is
// deleted while the sidecar is down, and the restarted sidecar still deletes
// the volume: nothing leaks (upstream issue #486).
func TestKillDuringCreateVolume(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--create-latency=4s"}, sidecarArgs: []string{"--timeout=30s"}})
	sc := s.class("slow", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "slow").Class(sc.Name))
	ctx := t.Context()
	// The driver answers 4s later.
	s.waitCreateVolumeStarted(claim)
	s.kill()
	got, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !inflight.Has(got) {
		t.Fatalf("claim lacks the in-flight finalizer while CreateVolume runs: %v", got.Finalizers)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The claim must survive (Terminating) while the sidecar is down.
	if _, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, claim.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("claim gone while the sidecar was down: %v", err)
	}
	if err := s.sidecar.Restart(); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, "pvc-"+string(claim.UID))
}

// TestKillDuringCreateVolumeThenNewPrefix: the sidecar is SIGKILLed while
// CreateVolume runs (the driver creates the volume and answers late), and
// the next one starts with another --volume-name-prefix, as a rolling
// update that changes the flag would. It must repeat the call under the
// recorded name and bind the claim to that volume: a call under the new
// name would create a second volume, and the first, which no PV records,
// would stay in the driver after the claim is deleted.
func TestKillDuringCreateVolumeThenNewPrefix(t *testing.T) {
	s := newStack(t, stackConfig{driverArgs: []string{"--create-latency=4s"}, sidecarArgs: []string{"--timeout=30s"}})
	sc := s.class("slow", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "renamed").Class(sc.Name))
	s.waitCreateVolumeStarted(claim)
	s.kill()
	if err := s.sidecar.Restart("--volume-name-prefix=vol"); err != nil {
		t.Fatal(err)
	}
	_, pv := s.waitBound(claim.Name)
	if want := "pvc-" + string(claim.UID); pv.Name != want {
		t.Errorf("claim bound to %s, want %s (the volume the first sidecar's call created)", pv.Name, want)
	}
	vols, err := s.driver.ListVolumes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 {
		t.Errorf("the driver has %d volumes, want 1", len(vols))
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestImmediateTopologyWithoutNodes: a topology-aware driver whose node
// plugin runs nowhere yet (no CSINode lists its keys) cannot place an
// immediate claim's volume. As upstream, the claim is not provisioned, and
// a Warning says why; nothing is created.
func TestImmediateTopologyWithoutNodes(t *testing.T) {
	s := newStack(t, stackConfig{topology: true})
	sc := s.class("nonodes", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "nowhere").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), "Warning", "ProvisioningFailed", "no available topology found")
	vols, err := s.driver.ListVolumes(t.Context())
	if err != nil || len(vols) != 0 {
		t.Fatalf("driver volumes = %v, %v; want none", vols, err)
	}
	s.deleteAndWaitGone(claim.Name, "")
}

// TestImmediateTopologyOff: with --immediate-topology=false an Immediate
// claim's CreateVolume carries no accessibility requirements, so the
// topology-aware driver of TestImmediateTopologyWithoutNodes (no CSINode
// lists its keys) places the volume itself; the PV's node affinity is the
// topology the driver reports.
func TestImmediateTopologyOff(t *testing.T) {
	s := newStack(t, stackConfig{topology: true, sidecarArgs: []string{"--immediate-topology=false"}})
	sc := s.class("anywhere", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "anywhere").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	s.checkOnDriverNode(pv)
	s.deleteAndWaitGone(claim.Name, pv.Name)
}

// TestClassMissingAfterHandOver: a claim handed to this driver whose class
// does not exist (deleted after the hand-over, or not created yet) gets one
// Warning ProvisioningFailed, the binder's, worded as kube-controller-manager
// words it; the provisioner, which also sees the claim (its failed
// provisioning counts), says nothing more. Once the class exists the claim
// is provisioned.
func TestClassMissingAfterHandOver(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := newStack(t, stackConfig{sidecarArgs: []string{"--http-endpoint=" + endpoint}})
	className := s.className + "-late"
	claim := s.claim(testutil.NewPVC(s.ns, "late").Class(className).
		Annotation("volume.kubernetes.io/storage-provisioner", s.driver.Name).
		Annotation("volume.beta.kubernetes.io/storage-provisioner", s.driver.Name))
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeWarning, "ProvisioningFailed", `storageclass.storage.k8s.io "`+className+`" not found`)
	// The provisioner has seen the claim without its class.
	waitMetric(t, endpoint, metricSeries("controller_persistentvolumeclaim_provision_failed_total", "class", className, "source", ""),
		func(n float64) bool { return n >= 1 })

	testutil.CreateClass(t, s.c, testutil.NewSC(className, s.driver.Name).Obj())
	s.waitBound(claim.Name)
	var warnings []string
	for _, e := range s.events(s.ns, string(claim.UID)) {
		if strings.HasPrefix(e, corev1.EventTypeWarning+" ") {
			warnings = append(warnings, e)
		}
	}
	if want := []string{`Warning ProvisioningFailed: storageclass.storage.k8s.io "` + className + `" not found`}; !slices.Equal(warnings, want) {
		t.Errorf("Warnings on the claim %q, want %q", warnings, want)
	}
}
