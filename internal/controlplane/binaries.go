package controlplane

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// ErrBinariesMissing is wrapped by [FindBinaries] when a pinned binary is not
// in the cache or reports another version.
var ErrBinariesMissing = errors.New("control plane binaries are missing; build them with `make tools` (the older Kubernetes of `make test-compat` with `hack/tools/build.sh kubernetes-compat`)")

// VersionEnv names an environment variable that selects the Kubernetes
// version of kube-apiserver and kube-controller-manager: empty means
// KUBERNETES_VERSION of hack/tools/versions.env; otherwise it must be that
// version or KUBERNETES_COMPAT_VERSION, the older one `make test-compat`
// runs against (built by `hack/tools/build.sh kubernetes-compat`).
const VersionEnv = "CSI_PROVISIONER_KUBERNETES_VERSION"

// Binaries are the paths of the pinned control plane programs.
type Binaries struct {
	Etcd                  string
	KubeAPIServer         string
	KubeControllerManager string
	// KubernetesVersion and EtcdVersion are the pinned versions the binaries
	// were checked against.
	KubernetesVersion string
	EtcdVersion       string
}

var (
	findOnce   sync.Once
	foundBins  Binaries
	errFinding error
)

// FindBinaries locates the cached binaries for the versions pinned in
// hack/tools/versions.env and checks that each reports its pinned version.
// The result is computed once per process. The error wraps
// [ErrBinariesMissing] when a binary must be (re)built.
func FindBinaries() (Binaries, error) {
	findOnce.Do(func() { foundBins, errFinding = findBinaries() })
	return foundBins, errFinding
}

func findBinaries() (Binaries, error) {
	versions, err := PinnedVersions()
	if err != nil {
		return Binaries{}, err
	}
	cache, err := CacheDir()
	if err != nil {
		return Binaries{}, err
	}
	kube, err := kubernetesVersion(versions, os.Getenv(VersionEnv))
	if err != nil {
		return Binaries{}, err
	}
	etcd := versions["ETCD_VERSION"]
	b := Binaries{
		Etcd:                  filepath.Join(cache, "etcd-"+etcd, "etcd"),
		KubeAPIServer:         filepath.Join(cache, "kubernetes-"+kube, "kube-apiserver"),
		KubeControllerManager: filepath.Join(cache, "kubernetes-"+kube, "kube-controller-manager"),
		KubernetesVersion:     kube,
		EtcdVersion:           etcd,
	}
	checks := []struct{ path, want string }{
		{b.Etcd, "etcd Version: " + strings.TrimPrefix(etcd, "v")},
		{b.KubeAPIServer, "Kubernetes " + kube},
		{b.KubeControllerManager, "Kubernetes " + kube},
	}
	for _, c := range checks {
		out, err := exec.Command(c.path, "--version").CombinedOutput()
		if err != nil {
			return Binaries{}, fmt.Errorf("%w: %s: %w", ErrBinariesMissing, c.path, err)
		}
		if !strings.Contains(string(out), c.want) {
			return Binaries{}, fmt.Errorf("%w: %s reports %q, want %q", ErrBinariesMissing, c.path, strings.TrimSpace(firstLine(out)), c.want)
		}
	}
	return b, nil
}

// kubernetesVersion returns the Kubernetes version to run: the pinned
// KUBERNETES_VERSION when want is empty, else want if versions.env pins it as
// KUBERNETES_VERSION or KUBERNETES_COMPAT_VERSION. Any other version is an
// error (not [ErrBinariesMissing]: no build would provide it).
func kubernetesVersion(versions map[string]string, want string) (string, error) {
	if want == "" {
		return versions["KUBERNETES_VERSION"], nil
	}
	for _, k := range []string{"KUBERNETES_VERSION", "KUBERNETES_COMPAT_VERSION"} {
		if v := versions[k]; v != "" && v == want {
			return want, nil
		}
	}
	return "", fmt.Errorf("%s=%s: hack/tools/versions.env pins KUBERNETES_VERSION=%s and KUBERNETES_COMPAT_VERSION=%s; use one of those",
		VersionEnv, want, versions["KUBERNETES_VERSION"], versions["KUBERNETES_COMPAT_VERSION"])
}

// KubernetesMinor is the minor version of [Binaries.KubernetesVersion]
// (37 for v1.37.2), for tests whose expectations depend on the server.
func (b Binaries) KubernetesMinor() int {
	minor, _, _ := strings.Cut(strings.TrimPrefix(b.KubernetesVersion, "v1."), ".")
	n, err := strconv.Atoi(minor)
	if err != nil {
		return 0
	}
	return n
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// CacheDir is where hack/tools/build.sh puts the binaries:
// ${XDG_CACHE_HOME:-$HOME/.cache}/csi-provisioner/bin.
func CacheDir() (string, error) {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find the tool cache: %w", err)
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "csi-provisioner", "bin"), nil
}

// RepoRoot finds the checkout this code runs from by walking up from the
// working directory to the directory holding hack/tools/versions.env.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "tools", "versions.env")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("hack/tools/versions.env not found above the working directory; run from inside the csi-provisioner checkout")
		}
		dir = parent
	}
}

// PinnedVersions parses hack/tools/versions.env (KEY=VALUE lines, # comments).
func PinnedVersions() (map[string]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(root, "hack", "tools", "versions.env"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	versions := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("versions.env: malformed line %q", line)
		}
		versions[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, k := range []string{"KUBERNETES_VERSION", "ETCD_VERSION"} {
		if versions[k] == "" {
			return nil, fmt.Errorf("versions.env: %s is not set", k)
		}
	}
	return versions, nil
}
