package e2e

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestRequestSizeLimits: the API server accepts any positive storage
// request; the sidecar sends the ones that fit a CreateVolume's int64
// bytes, rounded up to whole bytes ("1500m" asks for 2), and refuses the
// larger ones with a Warning that names the size, instead of asking the
// driver for its default size (Quantity.Value() of "10E" is 0) or a
// negative one.
func TestRequestSizeLimits(t *testing.T) {
	s := newStack(t, stackConfig{memory: true})
	sc := s.class("sizes", nil)
	tooLarge := map[string]string{"exa": "10E", "int64-plus-one": "9223372036854775808"}
	uids := map[string]string{}
	for name, size := range tooLarge {
		uids[name] = string(s.claim(testutil.NewPVC(s.ns, name).Class(sc.Name).Size(size)).UID)
	}
	fitting := map[string]string{"one-byte": "1", "milli": "1500m"}
	for name, size := range fitting {
		s.claim(testutil.NewPVC(s.ns, name).Class(sc.Name).Size(size))
	}
	for name, size := range tooLarge {
		s.waitEvent(s.ns, uids[name], corev1.EventTypeWarning, "ProvisioningFailed",
			"requested size "+size+" is more than the 9223372036854775807 bytes a CSI CreateVolume request can carry")
	}
	var handles []string
	for name, size := range fitting {
		_, pv := s.waitBound(name)
		if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse(size)) < 0 {
			t.Errorf("PV %s of claim %s (%s) has capacity %s", pv.Name, name, size, got.String())
		}
		handles = append(handles, pv.Spec.CSI.VolumeHandle)
	}
	for name := range tooLarge {
		if got := s.getClaim(name); got.Status.Phase != corev1.ClaimPending || got.Spec.VolumeName != "" {
			t.Errorf("claim %s: phase %s, volume %q; want Pending without volume", name, got.Status.Phase, got.Spec.VolumeName)
		}
	}
	vols, err := s.driver.ListVolumes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != len(handles) {
		t.Errorf("driver has %d volumes, want the %d of the fitting claims %v", len(vols), len(handles), handles)
	}
}
