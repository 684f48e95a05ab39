// Package integration runs the binder, the provisioner and the harness
// against a real kube-apiserver and etcd started by internal/controlplane.
package integration

import (
	"os"
	"testing"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// shared is one control plane for the tests of this package; each test works
// in its own namespace and with its own class and driver names.
var shared *controlplane.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(controlplane.RunMain(m, controlplane.Config{}, &shared))
}
