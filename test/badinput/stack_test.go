package badinput

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

var shared *controlplane.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(controlplane.RunMain(m, controlplane.Config{ExtraAPIServerArgs: vacArgs()}, &shared))
}

// vacServedV1 is false on API servers before v1.34, which serve
// VolumeAttributesClasses as v1beta1 at most (make test-compat).
var vacServedV1 = true

// vacArgs runs an API server before v1.34 as clusters that use
// VolumeAttributesClasses run it (gate on, v1beta1 served); without the
// gate it would drop a claim's class name and the claim would be bound.
func vacArgs() []string {
	if bins, err := controlplane.FindBinaries(); err == nil && bins.KubernetesMinor() < 34 {
		vacServedV1 = false
		return []string{"--feature-gates=VolumeAttributesClass=true", "--runtime-config=storage.k8s.io/v1beta1/volumeattributesclasses=true"}
	}
	return nil
}

// stack is one driver and one sidecar with a driver name and a namespace
// of their own on the shared control plane.
type stack struct {
	t       *testing.T
	cp      *controlplane.ControlPlane
	c       kubernetes.Interface
	bins    e2e.Binaries
	ns      string
	driver  *e2e.Driver
	sidecar *e2e.Sidecar
	dir     string
}

// newStack starts a hostpath driver (dir backend) named name and a sidecar
// for it, in namespace name.
func newStack(t *testing.T, name string, driverArgs, sidecarArgs []string) *stack {
	t.Helper()
	cp := controlplane.Need(t, shared)
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{t: t, cp: cp, c: cp.Client(), bins: bins, ns: name, dir: t.TempDir()}
	if _, err := s.c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.driver, err = e2e.StartDriver(t.Context(), bins.Driver, e2e.DriverConfig{Dir: s.dir, Name: name + ".csi.kube-storage.io", Args: driverArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.driver.Stop(5 * time.Second) })
	s.sidecar, err = e2e.StartSidecar(bins.Sidecar, e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: s.driver.Socket, LogPath: filepath.Join(s.dir, "sidecar.log"),
		Args: append([]string{"--binder-resync-period=2s", "--retry-interval-max=5s"}, sidecarArgs...),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.sidecar.StopAtCleanup(t, s.driver)
	if err := s.sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	return s
}

// class creates a StorageClass of the stack's driver named name, modified
// by mod (nil: none).
func (s *stack) class(t *testing.T, name string, mod func(*storagev1.StorageClass)) *storagev1.StorageClass {
	t.Helper()
	sc := testutil.NewSC(name, s.driver.Name).Obj()
	sc.ResourceVersion, sc.UID = "", ""
	if mod != nil {
		mod(sc)
	}
	created, err := s.c.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// createClaim creates a claim in the stack's namespace.
func (s *stack) createClaim(ctx context.Context, b *testutil.PVCBuilder) (*corev1.PersistentVolumeClaim, error) {
	pvc := b.RV("").Obj()
	pvc.Namespace = s.ns
	return s.c.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, pvc, metav1.CreateOptions{})
}

func (s *stack) claim(t *testing.T, b *testutil.PVCBuilder) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := s.createClaim(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (s *stack) getClaim(t *testing.T, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	c, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitPhase waits until the claim has the phase and returns it.
func (s *stack) waitPhase(t *testing.T, name string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
	t.Helper()
	var c *corev1.PersistentVolumeClaim
	testutil.Eventually(t, 0, fmt.Sprintf("claim %s not %s", name, phase), func(ctx context.Context) (bool, error) {
		var err error
		c, err = s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && c.Status.Phase == phase, err
	})
	return c
}

// waitGone waits until the claim is gone.
func (s *stack) waitClaimGone(t *testing.T, name string) {
	t.Helper()
	testutil.Eventually(t, 0, "claim "+name+" not deleted", func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}

// event is one expected event: type, reason and fragments of the message.
type event struct {
	typ, reason string
	fragments   []string
}

func (e event) String() string {
	return fmt.Sprintf("%s %s containing %q", e.typ, e.reason, e.fragments)
}

// events lists the events about the object with uid, as "Type Reason: message".
func (s *stack) events(ctx context.Context, ns string, uid string) ([]string, error) {
	list, err := s.c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + uid})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	slices.Sort(out)
	return out, nil
}

// waitEvent waits up to a minute for the event on the object with uid.
// Without it, the row fails (and goes on) listing the events the object
// did get, which is what a report needs.
func (s *stack) waitEvent(t *testing.T, ns, uid string, want event) bool {
	t.Helper()
	var seen []string
	matched := false
	deadline := time.Now().Add(time.Minute)
	testutil.Eventually(t, 2*time.Minute, "list events", func(ctx context.Context) (bool, error) {
		l, err := s.events(ctx, ns, uid)
		if err != nil {
			return false, nil
		}
		seen, matched = l, matchEvent(l, want)
		return matched || time.Now().After(deadline), nil
	})
	if !matched {
		t.Errorf("no event %s on %s; the object's events:\n  %s", want, uid, strings.Join(seen, "\n  "))
		return false
	}
	t.Logf("event on %s: %s", uid, matchingEvent(seen, want))
	return true
}

func matchEvent(events []string, want event) bool {
	return matchingEvent(events, want) != ""
}

// matchingEvent returns the first of events that matches want, or "".
func matchingEvent(events []string, want event) string {
	for _, e := range events {
		if !strings.HasPrefix(e, want.typ+" "+want.reason+":") {
			continue
		}
		ok := true
		for _, f := range want.fragments {
			ok = ok && strings.Contains(e, f)
		}
		if ok {
			return e
		}
	}
	return ""
}

// volumeIDs lists the driver's volume IDs.
func (s *stack) volumeIDs(t *testing.T) []string {
	t.Helper()
	ids, err := s.driver.VolumeIDs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// checkVolumes fails unless the driver still has every volume of before
// and exactly created new ones.
func (s *stack) checkVolumes(t *testing.T, before []string, created int) {
	t.Helper()
	after := s.volumeIDs(t)
	var gone, added []string
	for _, id := range before {
		if !slices.Contains(after, id) {
			gone = append(gone, id)
		}
	}
	for _, id := range after {
		if !slices.Contains(before, id) {
			added = append(added, id)
		}
	}
	if len(gone) > 0 || len(added) != created {
		t.Errorf("driver volumes: %d deleted %v, %d created %v; want none deleted and %d created", len(gone), gone, len(added), added, created)
	}
}

// klogLine matches a klog header (text format): severity, date, time.
var klogLine = regexp.MustCompile(`^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} `)
