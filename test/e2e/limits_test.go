package e2e

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/e2e"
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

// TestVolumeNamePrefixLimit: a PV name has at most 253 characters. With
// the longest --volume-name-prefix that fits a whole claim UID (216
// characters) claims are provisioned and bound to PVs of exactly 253
// characters; one character more, and every PV would be refused by the
// API server after its volume was created, so the sidecar stops at start
// with status 1 and says why.
func TestVolumeNamePrefixLimit(t *testing.T) {
	longest := strings.Repeat("p", 216)
	s := newStack(t, stackConfig{memory: true, sidecarArgs: []string{"--volume-name-prefix=" + longest}})
	sc := s.class("prefix", nil)
	claim := s.claim(testutil.NewPVC(s.ns, "long").Class(sc.Name))
	_, pv := s.waitBound(claim.Name)
	if want := longest + "-" + string(claim.UID); pv.Name != want || len(pv.Name) != 253 {
		t.Errorf("PV name = %q (%d characters), want %q", pv.Name, len(pv.Name), want)
	}
	s.deleteAndWaitGone(claim.Name, pv.Name)

	cfg := s.sidecarCfg
	cfg.LogPath = filepath.Join(s.dir, "sidecar-too-long.log")
	cfg.Args = append(slices.Clone(cfg.Args), "--volume-name-prefix="+longest+"p")
	r, err := e2e.StartSidecar(s.sidecarBin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.StopAtCleanup(t, s.driver)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var exit *exec.ExitError
	if err := r.WaitExit(ctx); !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("the sidecar with a 217-character prefix did not exit with status 2 (a flag error): %v", err)
	}
	if err := r.WaitLog(ctx, "(the prefix, a dash and 36 characters of the claim UID): must be no more than 253 characters"); err != nil {
		t.Fatal(err)
	}
}

// TestLongClaimNames: a claim whose name has the 253 characters a claim
// name may have, in a namespace of the 63 a namespace name may have, is
// provisioned (with --extra-create-metadata, which passes both names to
// the driver), bound, announced by a Normal ProvisioningSucceeded event
// (client-go names an event after its object when that fits), and
// deleted with its volume.
func TestLongClaimNames(t *testing.T) {
	s := newStack(t, stackConfig{memory: true, sidecarArgs: []string{"--extra-create-metadata"}})
	sc := s.class("long", nil)
	ns := (s.ns + "-" + strings.Repeat("n", 63))[:63]
	if _, err := s.c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	name := strings.Repeat("c", 253)
	claim, err := s.c.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), testutil.NewPVC(ns, name).Class(sc.Name).RV("").Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pvName string
	testutil.Eventually(t, 0, "the claim with a 253-character name is not Bound", func(ctx context.Context) (bool, error) {
		got, err := s.c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pvName = got.Spec.VolumeName
		return got.Status.Phase == corev1.ClaimBound, nil
	})
	pv, err := s.c.CoreV1().PersistentVolumes().Get(t.Context(), pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.Name != name || ref.Namespace != ns || ref.UID != claim.UID {
		t.Errorf("PV %s claimRef = %+v, want the claim", pv.Name, ref)
	}
	s.waitEvent(ns, string(claim.UID), corev1.EventTypeNormal, "ProvisioningSucceeded", "Successfully provisioned volume "+pv.Name)
	if err := s.c.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 0, "PV "+pv.Name+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), ignoreNotFound(err)
	})
	testutil.Eventually(t, 0, "the driver still has volumes", func(ctx context.Context) (bool, error) {
		vols, err := s.driver.ListVolumes(ctx)
		return len(vols) == 0, err
	})
}
