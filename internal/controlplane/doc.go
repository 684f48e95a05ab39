// Package controlplane runs a real, local Kubernetes control plane for
// integration tests, the demo and the benchmark: etcd, kube-apiserver and,
// optionally, kube-controller-manager, each a separate process on free
// loopback ports in a temporary directory.
//
// The binaries are built from the Go module proxy at the versions pinned in
// hack/tools/versions.env and cached outside the checkout by
// hack/tools/build.sh (`make tools`); [FindBinaries] locates them and checks
// their versions, so a stale binary is never used. [VersionEnv] selects the
// older Kubernetes pinned as KUBERNETES_COMPAT_VERSION instead (`make
// test-compat`); [Binaries.KubernetesMinor] lets a test expect what that
// version does.
//
// What a started control plane provides:
//   - TLS on the API server with a generated CA, and an admin client
//     certificate in group system:masters ([ControlPlane.AdminConfig],
//     [ControlPlane.KubeconfigPath]);
//   - RBAC authorization, so tests can run components under a narrower
//     identity through impersonation;
//   - a service-account signing key pair;
//   - kube-controller-manager with only the controllers asked for. By default
//     these are the PVC and PV protection controllers: without them the
//     finalizers that admission adds to every PVC and PV are never removed.
//
// Every process is started in its own process group with a parent-death
// signal, from a goroutine that holds its OS thread for the life of the
// program, so the processes die with the test binary even when it panics or
// times out; [ControlPlane.Stop] stops them in order and waits for them.
package controlplane
