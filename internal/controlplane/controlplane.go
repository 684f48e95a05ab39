package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Controller names of kube-controller-manager v1.37 used here.
const (
	PVCProtectionController = "persistentvolumeclaim-protection-controller"
	PVProtectionController  = "persistentvolume-protection-controller"
	PVBinderController      = "persistentvolume-binder-controller"
)

// DefaultControllers are run by kube-controller-manager unless
// [Config.Controllers] says otherwise: the protection controllers remove the
// finalizers that admission adds to every PVC and PV.
var DefaultControllers = []string{PVCProtectionController, PVProtectionController}

// ReferenceBinderConfig is the control plane the differential tests
// compare this sidecar with: kube-controller-manager runs its PV binder
// next to the protection controllers, syncs every second, and its client
// is unthrottled, so that its writes and events of one step are not spread
// over seconds by its default 20 QPS while a test waits for a state that
// stays unchanged.
func ReferenceBinderConfig() Config {
	return Config{
		Controllers:                append([]string{PVBinderController}, DefaultControllers...),
		ExtraControllerManagerArgs: []string{"--pvclaimbinder-sync-period=1s"},
		ControllerManagerQPS:       1000, ControllerManagerBurst: 2000,
	}
}

// Config says what to start.
type Config struct {
	// Dir is the working directory (certificates, etcd data, logs). Empty
	// means a new temporary directory, removed by Stop.
	Dir string
	// Controllers run by kube-controller-manager. Nil means
	// DefaultControllers; an empty non-nil slice starts no
	// kube-controller-manager.
	Controllers []string
	// ControllerManagerQPS and ControllerManagerBurst set
	// kube-controller-manager's client rate limit (0: its defaults).
	ControllerManagerQPS   float32
	ControllerManagerBurst int
	// Fsync makes etcd sync its log to disk, as in production. Off by
	// default: tests do not need durability and run faster without it.
	Fsync bool
	// ExtraAPIServerArgs are appended to kube-apiserver's arguments.
	ExtraAPIServerArgs []string
	// ExtraControllerManagerArgs are appended to kube-controller-manager's
	// arguments (for example a shorter --pvclaimbinder-sync-period).
	ExtraControllerManagerArgs []string

	// pickPort replaces FreePort for etcd and kube-apiserver, so a test can
	// hand out a taken port.
	pickPort func() (int, error)
}

// ControlPlane is a running etcd, kube-apiserver and, optionally,
// kube-controller-manager.
type ControlPlane struct {
	// Dir holds certificates, data and the logs etcd.log, kube-apiserver.log
	// and kube-controller-manager.log.
	Dir string
	// URL is the API server's https address.
	URL string
	// KubeconfigPath is an admin kubeconfig for programs started by tests.
	KubeconfigPath string
	// Binaries are the programs in use.
	Binaries Binaries

	cfg        Config
	ownsDir    bool
	pki        *pki
	etcdURL    string
	apiArgs    []string
	mu         sync.Mutex
	etcd       *Process
	apiserver  *Process
	kcm        *Process
	stopped    bool
	adminCfg   *rest.Config
	kubeClient kubernetes.Interface
}

// Start starts etcd and kube-apiserver, waits until the API server is ready,
// then starts kube-controller-manager with the configured controllers. On
// error everything started so far is stopped.
func Start(ctx context.Context, cfg Config) (_ *ControlPlane, err error) {
	bins, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{cfg: cfg, Binaries: bins, Dir: cfg.Dir}
	if cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "csi-provisioner-controlplane-"); err != nil {
			return nil, err
		}
		cp.ownsDir = true
	} else if err := os.MkdirAll(cp.Dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = cp.Stop()
		}
	}()
	if cp.pki, err = newPKI(cp.Dir); err != nil {
		return nil, err
	}
	if err := cp.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx); err != nil {
		return nil, err
	}
	controllers := cfg.Controllers
	if controllers == nil {
		controllers = DefaultControllers
	}
	if len(controllers) > 0 {
		if err := cp.StartControllerManager(controllers...); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// AdminConfig returns a new copy of the admin client configuration
// (system:masters) with a high client-side rate limit.
func (cp *ControlPlane) AdminConfig() *rest.Config {
	return rest.CopyConfig(cp.adminCfg)
}

// Client is an admin clientset.
func (cp *ControlPlane) Client() kubernetes.Interface { return cp.kubeClient }

func (cp *ControlPlane) freePort() (int, error) {
	if cp.cfg.pickPort != nil {
		return cp.cfg.pickPort()
	}
	return FreePort()
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	return startOnFreePorts(filepath.Join(cp.Dir, "etcd.log"), func() (*Process, error) {
		return cp.tryStartEtcd(ctx)
	})
}

func (cp *ControlPlane) tryStartEtcd(ctx context.Context) (*Process, error) {
	clientPort, err := cp.freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := cp.freePort()
	if err != nil {
		return nil, err
	}
	dataDir := filepath.Join(cp.Dir, "etcd-data")
	// A failed attempt may have written its member, with its ports, there.
	if err := os.RemoveAll(dataDir); err != nil {
		return nil, err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	args := []string{
		"--name=default",
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--log-level=warn",
	}
	if !cp.cfg.Fsync {
		args = append(args, "--unsafe-no-fsync")
	}
	p, err := StartProcess("etcd", cp.Binaries.Etcd, args, nil, filepath.Join(cp.Dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	cp.mu.Lock()
	cp.etcd = p
	cp.mu.Unlock()
	cp.etcdURL = client
	return p, waitFor(ctx, p, 30*time.Second, func(ctx context.Context) bool {
		return httpOK(ctx, http.DefaultClient, client+"/health")
	})
}

func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	return startOnFreePorts(filepath.Join(cp.Dir, "kube-apiserver.log"), func() (*Process, error) {
		return cp.tryStartAPIServer(ctx)
	})
}

func (cp *ControlPlane) tryStartAPIServer(ctx context.Context) (*Process, error) {
	port, err := cp.freePort()
	if err != nil {
		return nil, err
	}
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	cp.apiArgs = []string{
		"--etcd-servers=" + cp.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The kubernetes Service endpoint cannot be a loopback address; nothing
		// here needs it.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + cp.pki.ServingCert,
		"--tls-private-key-file=" + cp.pki.ServingKey,
		"--client-ca-file=" + cp.pki.CACert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + cp.pki.SAPublic,
		"--service-account-signing-key-file=" + cp.pki.SAPrivate,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		// No service-account controllers run here, so pods could not be
		// admitted with the ServiceAccount plugin on.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
		"--v=1",
	}
	cp.apiArgs = append(cp.apiArgs, cp.cfg.ExtraAPIServerArgs...)

	cp.adminCfg = &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.pki.caPEM,
			CertData: cp.pki.adminCertPEM,
			KeyData:  cp.pki.adminKeyPEM,
		},
		QPS:   1000,
		Burst: 2000,
	}
	if cp.kubeClient, err = kubernetes.NewForConfig(cp.adminCfg); err != nil {
		return nil, err
	}
	if err := cp.writeKubeconfig(); err != nil {
		return nil, err
	}
	return cp.runAPIServer(ctx)
}

func (cp *ControlPlane) runAPIServer(ctx context.Context) (*Process, error) {
	p, err := StartProcess("kube-apiserver", cp.Binaries.KubeAPIServer, cp.apiArgs, nil, filepath.Join(cp.Dir, "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	cp.mu.Lock()
	cp.apiserver = p
	cp.mu.Unlock()
	rc, err := rest.HTTPClientFor(cp.adminCfg)
	if err != nil {
		return p, err
	}
	return p, waitFor(ctx, p, 90*time.Second, func(ctx context.Context) bool {
		return httpOK(ctx, rc, cp.URL+"/readyz")
	})
}

// RestartAPIServer stops kube-apiserver and starts it again with the same
// arguments and port, then waits until it is ready. etcd keeps the data.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) error {
	if err := cp.StopAPIServer(); err != nil {
		return err
	}
	return cp.StartAPIServer(ctx)
}

// StopAPIServer stops kube-apiserver: clients see connections refused until
// StartAPIServer. Stopping a stopped one does nothing.
func (cp *ControlPlane) StopAPIServer() error {
	cp.mu.Lock()
	p := cp.apiserver
	cp.apiserver = nil
	cp.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(10 * time.Second)
}

// PauseAPIServer stops kube-apiserver's process (SIGSTOP) without closing
// its connections: requests hang, unanswered, until ResumeAPIServer.
func (cp *ControlPlane) PauseAPIServer() error { return cp.signalAPIServer(syscall.SIGSTOP) }

// ResumeAPIServer lets a paused kube-apiserver go on (SIGCONT); the
// requests it holds are answered.
func (cp *ControlPlane) ResumeAPIServer() error { return cp.signalAPIServer(syscall.SIGCONT) }

func (cp *ControlPlane) signalAPIServer(sig syscall.Signal) error {
	cp.mu.Lock()
	p := cp.apiserver
	cp.mu.Unlock()
	if p == nil {
		return errors.New("kube-apiserver is not running")
	}
	return p.Signal(sig)
}

// StartAPIServer starts kube-apiserver after StopAPIServer, with the same
// arguments and port, and waits until it is ready.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	_, err := cp.runAPIServer(ctx)
	return err
}

// StartControllerManager starts kube-controller-manager with exactly the given
// controllers, stopping one that is already running.
func (cp *ControlPlane) StartControllerManager(controllers ...string) error {
	if err := cp.StopControllerManager(); err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + cp.KubeconfigPath,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--v=2",
	}
	if cp.cfg.ControllerManagerQPS > 0 {
		args = append(args, "--kube-api-qps="+strconv.FormatFloat(float64(cp.cfg.ControllerManagerQPS), 'f', -1, 32))
	}
	if cp.cfg.ControllerManagerBurst > 0 {
		args = append(args, "--kube-api-burst="+strconv.Itoa(cp.cfg.ControllerManagerBurst))
	}
	args = append(args, cp.cfg.ExtraControllerManagerArgs...)
	p, err := StartProcess("kube-controller-manager", cp.Binaries.KubeControllerManager, args, nil, filepath.Join(cp.Dir, "kube-controller-manager.log"))
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.kcm = p
	cp.mu.Unlock()
	// kube-controller-manager serves nothing here; a quick exit means a bad flag.
	select {
	case <-p.Exited():
		return fmt.Errorf("kube-controller-manager exited at start: %w; see %s", p.ExitErr(), p.LogPath)
	case <-time.After(300 * time.Millisecond):
	}
	return nil
}

// StopControllerManager stops kube-controller-manager if it runs.
func (cp *ControlPlane) StopControllerManager() error {
	cp.mu.Lock()
	p := cp.kcm
	cp.kcm = nil
	cp.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Stop(10 * time.Second)
}

// Processes lists the running processes, for checks and diagnostics.
func (cp *ControlPlane) Processes() []*Process {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	var ps []*Process
	for _, p := range []*Process{cp.kcm, cp.apiserver, cp.etcd} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// Stop stops kube-controller-manager, kube-apiserver and etcd, in that order,
// waits for each to exit, and removes the working directory if Start created
// it. It is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return nil
	}
	cp.stopped = true
	procs := []*Process{cp.kcm, cp.apiserver, cp.etcd}
	cp.mu.Unlock()
	var errs []error
	for _, p := range procs {
		if p != nil {
			errs = append(errs, p.Stop(10*time.Second))
		}
	}
	if cp.ownsDir && os.Getenv("CSI_PROVISIONER_KEEP_CONTROLPLANE_DIR") == "" {
		errs = append(errs, os.RemoveAll(cp.Dir))
	}
	return errors.Join(errs...)
}

func (cp *ControlPlane) writeKubeconfig() error {
	cp.KubeconfigPath = filepath.Join(cp.Dir, "admin.kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.pki.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cp.pki.adminCertPEM, ClientKeyData: cp.pki.adminKeyPEM}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "admin"}
	cfg.CurrentContext = "local"
	return clientcmd.WriteToFile(*cfg, cp.KubeconfigPath)
}

// waitFor polls ready every 100ms until it is true, the process exits, the
// timeout passes or ctx is done.
func waitFor(ctx context.Context, p *Process, timeout time.Duration, ready func(context.Context) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if ready(ctx) {
			return nil
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("%s exited before it was ready: %w; last lines of %s:\n%s", p.Name, p.ExitErr(), p.LogPath, TailFile(p.LogPath, 20))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w; last lines of %s:\n%s", p.Name, timeout, ctx.Err(), p.LogPath, TailFile(p.LogPath, 20))
		case <-tick.C:
		}
	}
}

func httpOK(ctx context.Context, c *http.Client, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TailFile returns the last n lines of a file, for error messages.
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
