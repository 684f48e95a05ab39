package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// UpstreamProvisioner returns the path of upstream external-provisioner's
// csi-provisioner binary at the version pinned in hack/tools/versions.env
// (EXTERNAL_PROVISIONER_VERSION), as `hack/tools/build.sh
// external-provisioner` caches it, after checking that it reports that
// version. The error wraps [controlplane.ErrBinariesMissing] when the binary
// must be (re)built, so that a test can skip as it does for the control
// plane.
func UpstreamProvisioner() (string, error) {
	versions, err := controlplane.PinnedVersions()
	if err != nil {
		return "", err
	}
	version := versions["EXTERNAL_PROVISIONER_VERSION"]
	if version == "" {
		return "", fmt.Errorf("versions.env: EXTERNAL_PROVISIONER_VERSION is not set")
	}
	cache, err := controlplane.CacheDir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(cache, "external-provisioner-"+version, "csi-provisioner")
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", controlplane.ErrBinariesMissing, path, err)
	}
	if !strings.Contains(string(out), version) {
		return "", fmt.Errorf("%w: %s reports %q, want %s", controlplane.ErrBinariesMissing, path, strings.TrimSpace(string(out)), version)
	}
	return path, nil
}
