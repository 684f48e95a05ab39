package e2e

import (
	"testing"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestVolumeAttributesClassNotServed: on an API server that does not serve
// storage.k8s.io/v1 VolumeAttributesClasses (as before v1.34), a claim that
// names one gets a Warning that says so and no volume is created, while a
// claim without one is provisioned and bound as usual. Before v1.34 the
// cluster is the one users run: the beta VolumeAttributesClass gate on, so
// claims keep the field, and v1beta1 served.
func TestVolumeAttributesClassNotServed(t *testing.T) {
	args := []string{"--runtime-config=storage.k8s.io/v1/volumeattributesclasses=false"}
	if bins, err := controlplane.FindBinaries(); err == nil && bins.KubernetesMinor() < 34 {
		args = []string{"--feature-gates=VolumeAttributesClass=true", "--runtime-config=storage.k8s.io/v1beta1/volumeattributesclasses=true"}
	}
	cp := controlplane.StartForTest(t, controlplane.Config{ExtraAPIServerArgs: args})
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
