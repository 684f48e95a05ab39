package e2e

import (
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestDriverErrorEchoesSecrets: the driver quotes the secrets of a refused
// CreateVolume or DeleteVolume in its error message (--echo-secrets), as a
// driver that formats the request into its errors does. The Warning
// ProvisioningFailed on the claim and VolumeFailedDelete on the PV keep the
// driver's message with the secret values stripped, and no value reaches
// the sidecar's log, even at -v=5 (where csi-lib-utils logs every call).
func TestDriverErrorEchoesSecrets(t *testing.T) {
	const good, badCreate, badDelete = "abc123", "wrong-create-b7f3", "wrong-delete-c9e1"
	s := newStack(t, stackConfig{
		driverArgs:  []string{"--require-create-secret=token=" + good, "--require-delete-secret=token=" + good, "--echo-secrets"},
		sidecarArgs: []string{"-v=5"},
	})
	ctx := t.Context()
	secrets := s.c.CoreV1().Secrets(s.ns)
	setToken := func(token string) {
		t.Helper()
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}, StringData: map[string]string{"token": token}}
		if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"token": badCreate},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sc := s.class("secret", func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":      "creds",
			"csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
		}
	})
	const echoed = `secret "token" has the wrong value; secrets sent: map[token:***stripped***]`
	claim := s.claim(testutil.NewPVC(s.ns, "data").Class(sc.Name))
	s.waitEvent(s.ns, string(claim.UID), corev1.EventTypeWarning, "ProvisioningFailed", echoed)

	setToken(good)
	_, pv := s.waitBound(claim.Name)
	setToken(badDelete)
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitEvent(metav1.NamespaceDefault, string(pv.UID), corev1.EventTypeWarning, "VolumeFailedDelete", echoed)

	events := append(s.events(s.ns, string(claim.UID)), s.events(metav1.NamespaceDefault, string(pv.UID))...)
	for _, e := range events {
		if strings.Contains(e, badCreate) || strings.Contains(e, badDelete) {
			t.Errorf("event shows a secret value: %s", e)
		}
	}
	setToken(good)
	s.waitGone(claim.Name, pv.Name)

	log, err := os.ReadFile(s.sidecarCfg.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "***stripped***") {
		t.Error("the sidecar log never shows a stripped secret: the driver's errors were not logged")
	}
	for _, v := range []string{badCreate, badDelete, good} {
		if strings.Contains(string(log), v) {
			t.Errorf("the sidecar log shows the secret value %q", v)
		}
	}
}
