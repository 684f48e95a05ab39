// Package e2e runs the real csi-provisioner and hostpath-driver binaries
// against a real kube-apiserver: the user-visible flows of provisioning,
// binding and deletion, end to end.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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
	// CrossNamespaceVolumeDataSource (alpha) lets claims name a data source
	// in another namespace (TestCrossNamespaceDataSource); nothing else
	// here uses it.
	os.Exit(controlplane.RunMain(m, controlplane.Config{
		ExtraAPIServerArgs: []string{"--feature-gates=CrossNamespaceVolumeDataSource=true"},
	}, &shared))
}

// stack is one driver and one sidecar serving a driver name of their own, in
// a namespace of their own, on the shared control plane.
type stack struct {
	t         *testing.T
	cp        *controlplane.ControlPlane
	c         kubernetes.Interface
	ns        string
	driver    *e2e.Driver
	sidecar   *e2e.Sidecar
	dir       string
	className string
	// sidecarCfg starts the sidecar; startReplica starts more with it.
	sidecarBin string
	sidecarCfg e2e.SidecarConfig
	// seenPVs are the PVs a flow of binderoff_test.go made, gone or not;
	// notes are what else the flow saw, to compare.
	seenPVs, notes []string
}

type stackConfig struct {
	driverArgs  []string
	sidecarArgs []string
	// sidecarEnv returns extra environment variables of the sidecar.
	sidecarEnv func(*stack) []string
	memory     bool
	topology   bool
	// driverName replaces the driver's name, <test>.csi.kube-storage.io.
	driverName string
	// nodeID replaces the driver's node ID, node-1.
	nodeID string
	// beforeSidecar runs after the namespace and the driver exist, before
	// the sidecar starts.
	beforeSidecar func(*stack)
	// controlPlane replaces the shared one.
	controlPlane *controlplane.ControlPlane
	// waitLog replaces "Started provisioner controller", the sidecar's log
	// line newStack waits for.
	waitLog string
	// upstream runs upstream external-provisioner instead of this sidecar,
	// with -v=4, --retry-interval-max=5s and sidecarArgs only.
	upstream bool
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// newStack starts a hostpath driver named after the test and a sidecar for it.
func newStack(t *testing.T, cfg stackConfig) *stack {
	t.Helper()
	cp := cfg.controlPlane
	if cp == nil {
		cp = controlplane.Need(t, shared)
	}
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	s := &stack{t: t, cp: cp, c: cp.Client(), dir: t.TempDir()}
	// The namespace, class and driver are named after the test; a repeated
	// run (go test -count=N) on the same control plane gets a suffix.
	for i := 1; ; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		ns, err := s.c.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		s.ns, s.className = ns.Name, ns.Name
		break
	}
	driverName := s.ns + ".csi.kube-storage.io"
	if cfg.driverName != "" {
		driverName = cfg.driverName
	}
	s.driver, err = e2e.StartDriver(t.Context(), bins.Driver, e2e.DriverConfig{
		Dir: s.dir, Name: driverName, NodeID: cfg.nodeID, Memory: cfg.memory, Topology: cfg.topology, Args: cfg.driverArgs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.driver.Stop(5 * time.Second) })
	if cfg.beforeSidecar != nil {
		cfg.beforeSidecar(s)
	}
	var env []string
	if cfg.sidecarEnv != nil {
		env = cfg.sidecarEnv(s)
	}
	s.sidecarBin = bins.Sidecar
	args := []string{"-v=4", "--binder-resync-period=2s", "--retry-interval-max=5s"}
	if cfg.upstream {
		if s.sidecarBin, err = e2e.UpstreamProvisioner(); err != nil {
			t.Fatalf("upstream external-provisioner (hack/tools/build.sh external-provisioner): %v", err)
		}
		args = []string{"-v=4", "--retry-interval-max=5s"}
	}
	s.sidecarCfg = e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: s.driver.Socket, LogPath: filepath.Join(s.dir, "sidecar.log"),
		Args: append(args, cfg.sidecarArgs...),
		Env:  env,
	}
	s.sidecar, err = e2e.StartSidecar(s.sidecarBin, s.sidecarCfg)
	if err != nil {
		t.Fatal(err)
	}
	s.sidecar.StopAtCleanup(t, s.driver)
	waitLog := "Started provisioner controller"
	if cfg.waitLog != "" {
		waitLog = cfg.waitLog
	}
	if err := s.sidecar.WaitLog(t.Context(), waitLog); err != nil {
		t.Fatal(err)
	}
	return s
}

// credsClass creates the Secret "creds" with the given token in the
// stack's namespace and a class name whose provisioner secret it is (so
// the deletion secret too, see the driver's --require-*-secret flags). It
// returns the class and a function that changes the token.
func (s *stack) credsClass(name, token string) (*storagev1.StorageClass, func(token string)) {
	s.t.Helper()
	ctx := s.t.Context()
	secrets := s.c.CoreV1().Secrets(s.ns)
	if _, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"token": token},
	}, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	setToken := func(token string) {
		s.t.Helper()
		sec, err := secrets.Get(ctx, "creds", metav1.GetOptions{})
		if err != nil {
			s.t.Fatal(err)
		}
		sec.Data = map[string][]byte{"token": []byte(token)}
		if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			s.t.Fatal(err)
		}
	}
	sc := s.class(name, func(sc *storagev1.StorageClass) {
		sc.Parameters = map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":      "creds",
			"csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
		}
	})
	return sc, setToken
}

// class creates a StorageClass of the stack's driver, modified by mod.
func (s *stack) class(name string, mod func(*storagev1.StorageClass)) *storagev1.StorageClass {
	s.t.Helper()
	sc := testutil.NewSC(s.className+"-"+name, s.driver.Name).Obj()
	if mod != nil {
		mod(sc)
	}
	return testutil.CreateClass(s.t, s.c, sc)
}

// claim creates a claim in the stack's namespace.
func (s *stack) claim(b *testutil.PVCBuilder) *corev1.PersistentVolumeClaim {
	s.t.Helper()
	pvc := b.RV("").Obj()
	pvc.Namespace = s.ns
	created, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Create(s.t.Context(), pvc, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return created
}

// waitBound waits for the claim to be Bound and returns it with its PV.
func (s *stack) waitBound(name string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	s.t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	testutil.Eventually(s.t, 0, "claim "+name+" not Bound", func(ctx context.Context) (bool, error) {
		var err error
		pvc, err = s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && pvc.Status.Phase == corev1.ClaimBound, err
	})
	pv, err := s.c.CoreV1().PersistentVolumes().Get(s.t.Context(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return pvc, pv
}

// deleteAndWaitGone deletes the claim and waits until it, its PV (if any)
// and every driver volume are gone.
func (s *stack) deleteAndWaitGone(name, pvName string) {
	s.t.Helper()
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.t.Context(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		s.t.Fatal(err)
	}
	s.waitGone(name, pvName)
}

func (s *stack) waitGone(name, pvName string) {
	s.t.Helper()
	s.waitClaimGone(name, "claim "+name+" not deleted")
	if pvName != "" {
		testutil.Eventually(s.t, 0, "PV "+pvName+" not deleted", func(ctx context.Context) (bool, error) {
			_, err := s.c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
			return apierrors.IsNotFound(err), ignoreNotFound(err)
		})
	}
	testutil.Eventually(s.t, 0, "the driver still has volumes", func(ctx context.Context) (bool, error) {
		vols, err := s.driver.ListVolumes(ctx)
		return len(vols) == 0, err
	})
}

// waitClaimGone waits until the claim of the stack's namespace is gone,
// failing with what if it never goes.
func (s *stack) waitClaimGone(name, what string) {
	s.t.Helper()
	testutil.Eventually(s.t, 0, what, func(ctx context.Context) (bool, error) {
		_, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), ignoreNotFound(err)
	})
}

// events returns the events about an object, as "Type Reason: message".
func (s *stack) events(ns string, uid string) []string {
	s.t.Helper()
	list, err := s.c.CoreV1().Events(ns).List(s.t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + uid})
	if err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
	}
	return out
}

// waitEvent waits for an event of the given type and reason whose message
// contains fragment, about the object with uid.
func (s *stack) waitEvent(ns, uid, eventType, reason, fragment string) {
	s.t.Helper()
	testutil.Eventually(s.t, 0, fmt.Sprintf("no %s %s event containing %q", eventType, reason, fragment), func(ctx context.Context) (bool, error) {
		for _, e := range s.events(ns, uid) {
			if strings.HasPrefix(e, eventType+" "+reason+":") && strings.Contains(e, fragment) {
				return true, nil
			}
		}
		return false, nil
	})
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
