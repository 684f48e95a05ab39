package e2e

import (
	"testing"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestVolumeAttributesClassNotServed: on an API server that does not serve
// storage.k8s.io/v1 VolumeAttributesClasses (as before v1.34), a claim that
// names one gets a Warning that says so and no volume is created, while a
// claim without one is provisioned and bound as usual.
func TestVolumeAttributesClassNotServed(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{
		ExtraAPIServerArgs: []string{"--runtime-config=storage.k8s.io/v1/volumeattributesclasses=false"},
	})
	s := newStack(t, stackConfig{controlPlane: cp})
	sc := s.class("plain", nil)
	withVAC := s.claim(testutil.NewPVC(s.ns, "with-class").Class(sc.Name).VolumeAttributesClass("gold"))
	plain := s.claim(testutil.NewPVC(s.ns, "plain").Class(sc.Name))
	_, pv := s.waitBound(plain.Name)
	s.waitEvent(s.ns, string(withVAC.UID), "Warning", "ProvisioningFailed",
		`VolumeAttributesClass "gold" cannot be read: the API server does not serve storage.k8s.io/v1 VolumeAttributesClasses`)
	vols, err := s.driver.ListVolumes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 1 {
		t.Errorf("driver volumes = %d, want 1 (the plain claim's)", len(vols))
	}
	s.deleteAndWaitGone(plain.Name, pv.Name)
}
