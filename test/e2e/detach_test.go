package e2e

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestDeleteAfterDetach: with a driver that publishes volumes, a Released
// volume that a VolumeAttachment still names is not deleted (one Normal
// event on the PV, no Warning); it is deleted as soon as the attachment
// goes, although the provisioning library would retry a failed deletion
// only after ten minutes. The test plays the attach/detach controller: it
// creates and deletes the VolumeAttachment.
func TestDeleteAfterDetach(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, driverArgs: []string{"--enable-attach"}, sidecarArgs: slowRetries})
	ctx := t.Context()
	sc := s.class("fs", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name).Size("1Gi"))
	_, pv := s.waitBound(claim.Name)

	va, err := s.c.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: s.ns + "-attachment"},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: s.driver.Name,
			NodeName: "node-a",
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(metav1.NamespaceDefault, string(pv.UID), corev1.EventTypeNormal, "VolumeDelete", "is still attached to node node-a: it is deleted once detached")
	if vols, err := s.driver.ListVolumes(ctx); err != nil || len(vols) != 1 {
		t.Fatalf("the driver's volumes while attached: %d, %v; want the one", len(vols), err)
	}
	if got := s.events(metav1.NamespaceDefault, string(pv.UID)); len(got) != 1 {
		t.Errorf("events of the attached PV %q, want only the Normal VolumeDelete", got)
	}

	if err := s.c.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitGone(claim.Name, pv.Name)
}
