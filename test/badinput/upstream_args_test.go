package badinput

import (
	"strings"
	"testing"
)

// argRow is a command line (and environment) a Deployment written for
// upstream may have.
type argRow struct {
	args []string
	env  []string
	// refusedHere is the fragment of README.md that documents why the
	// sidecar refuses what upstream accepts; empty, the sidecar must
	// accept whatever upstream accepts.
	refusedHere string
}

// wordAfterBool is README.md's word on a value written after a boolean
// flag without "=".
const wordAfterBool = "also a value written after a boolean flag without `=`: there `--leader-election false` turns leader election on"

func argRows() []argRow {
	return []argRow{
		{},
		{args: []string{"--csi-address", "/csi/csi.sock"}},
		{args: []string{"--csi-address=unix:///csi/csi.sock"}},
		{args: []string{"--timeout=30s", "--retry-interval-start", "2s", "--retry-interval-max=10m"}},
		{args: []string{"--timeout", "1m30s"}},
		{args: []string{"--feature-gates=Topology=true,CrossNamespaceVolumeDataSource=false"}},
		{args: []string{"--feature-gates=Topology=true, VolumeAttributesClass=true"}},
		{args: []string{"--feature-gates=Topology=True"}},
		{args: []string{"--feature-gates=Topology=false"}},
		{args: []string{"--feature-gates", "VolumeAttributesClass=false"}},
		{args: []string{"--feature-gates=ReleaseLeaderElectionOnExit=true", "--feature-gates=CrossNamespaceVolumeDataSource=true"}},
		{args: []string{"--feature-gates=AllAlpha=true,CrossNamespaceVolumeDataSource=false"}},
		{args: []string{"--feature-gates=AllBeta=true"}},
		{args: []string{"--feature-gates="}},
		{args: []string{"--feature-gates=HonorPVReclaimPolicy=true"}}, // refused by both: not upstream's
		{args: []string{"--automaxprocs"}},
		{args: []string{"--automaxprocs=false"}},
		{args: []string{"--automaxprocs=true"}},
		{args: []string{"--leader-election", "--leader-election-namespace=kube-system", "--leader-election-lease-duration=137s",
			"--leader-election-renew-deadline=107s", "--leader-election-retry-period=26s", "--leader-election-labels=team:storage,tier:csi"}},
		{args: []string{"--leader-election=true", "--leader-election-labels", "a:b", "--leader-election-labels=c:"}},
		{args: []string{"--leader-election=false"}},
		{args: []string{"--v=5"}}, {args: []string{"-v=5"}}, {args: []string{"-v5"}}, {args: []string{"-v", "5"}}, {args: []string{"--v", "5"}},
		{args: []string{"--v=4", "--vmodule=controller*=5,csi*=4"}},
		{args: []string{"--logging-format=json", "--v=5"}},
		{args: []string{"--logging-format", "text", "--log-flush-frequency=1s"}},
		{args: []string{"--logging-format=json", "--log-json-split-stream=false", "--log-json-info-buffer-size=0"}},
		{args: []string{"--metrics-address=:0"}},
		{args: []string{"--metrics-address", ":0", "--metrics-path", "/custom/metrics"}},
		{args: []string{"--http-endpoint=:0", "--enable-pprof"}},
		{args: []string{"--http-endpoint=:0", "--metrics-address=:0"}}, // refused by both
		{args: []string{"--kube-api-qps=50", "--kube-api-burst=100", "--kube-api-capacity-qps=0.5", "--kube-api-capacity-burst", "2"}},
		{args: []string{"--kube-api-qps=-1", "--kube-api-burst=0"}},
		{args: []string{"--kube-api-qps=1e2", "--kube-api-burst=0x20"}},
		{args: []string{"--worker-threads=10", "--capacity-threads", "2", "--cloning-protection-threads=4"}},
		{args: []string{"--volume-name-prefix=vol", "--volume-name-uuid-length=16"}},
		{args: []string{"--volume-name-uuid-length", "-1", "--capacity-ownerref-level", "-1", "--kube-api-qps", "-1"}},
		// A value that looks like a flag is the prefix for both; no PV
		// name can start with "-".
		{args: []string{"--volume-name-prefix", "-v5"}, refusedHere: "a leading `-`"},
		{args: []string{"--default-fstype=ext4", "--extra-create-metadata", "--controller-publish-readonly=true"}},
		{args: []string{"--strict-topology", "--immediate-topology=false", "--prevent-volume-mode-conversion=false"}},
		{args: []string{"--snapshot-orphan-sweep-interval=0"}},
		{args: []string{"--enable-capacity", "--capacity-ownerref-level=2", "--capacity-poll-interval=5m", "--capacity-for-immediate-binding"},
			env: []string{"NAMESPACE=kube-system", "POD_NAME=csi-provisioner-0"}},
		{args: []string{"--node-deployment", "--node-deployment-immediate-binding=false", "--node-deployment-base-delay=5s", "--node-deployment-max-delay=30s"},
			env: []string{"NODE_NAME=worker-1"}},
		{args: []string{"--node-deployment"}}, // refused by both: no NODE_NAME
		{args: []string{"--kubeconfig=/nonexistent/kubeconfig"}},
		{args: []string{"--kubeconfig", "/nonexistent/flag"}, env: []string{"KUBECONFIG=/nonexistent/env"}},
		// The command lines of upstream's deploy/kubernetes and of drivers
		// that ship upstream v6.3.0 (csi-driver-host-path, its distributed
		// deployment, csi-driver-nfs), $(ADDRESS) as the kubelet expands it.
		{args: []string{"--csi-address=/var/lib/csi/sockets/pluginproxy/mock.socket", "--leader-election", "--http-endpoint=:8080"}},
		{args: []string{"--csi-address=/var/lib/csi/sockets/pluginproxy/mock.socket", "--leader-election", "--enable-capacity", "--capacity-ownerref-level=2"},
			env: []string{"NAMESPACE=default", "POD_NAME=csi-provisioner-5c7f9d8b6-abcde"}},
		{args: []string{"-v=5", "--csi-address=/csi/csi.sock", "--feature-gates=Topology=true"}},
		{args: []string{"-v=5", "--csi-address=/csi/csi.sock", "--feature-gates=Topology=true", "--enable-capacity", "--capacity-ownerref-level=0",
			"--node-deployment=true", "--strict-topology=true", "--immediate-topology=false", "--worker-threads=5"},
			env: []string{"NODE_NAME=worker-1", "NAMESPACE=default", "POD_NAME=csi-hostpathplugin-x7k2p"}},
		{args: []string{"-v=2", "--csi-address=/csi/csi.sock", "--leader-election", "--leader-election-namespace=kube-system", "--extra-create-metadata=true",
			"--feature-gates=VolumeAttributesClass=false", "--timeout=1200s", "--retry-interval-max=30m"}},
		{args: []string{"--version"}},
		{args: []string{"--help"}},
		{args: []string{"-h"}},
		{args: []string{"--leader-election", "true"}, refusedHere: wordAfterBool},
		{args: []string{"--leader-election", "false"}, refusedHere: wordAfterBool},
		{args: []string{"--automaxprocs", "false"}, refusedHere: wordAfterBool},
		{args: []string{"--v=5", "extra"}, refusedHere: "Words that are not flags. Upstream ignores them wherever they stand"},
		{args: []string{"--worker-threads=0"}, refusedHere: "`--worker-threads`, `--capacity-threads` or `--cloning-protection-threads` 0"},
		{args: []string{"--capacity-threads=0"}, refusedHere: "`--worker-threads`, `--capacity-threads` or `--cloning-protection-threads` 0"},
		{args: []string{"--cloning-protection-threads=0"}, refusedHere: "`--worker-threads`, `--capacity-threads` or `--cloning-protection-threads` 0"},
		{args: []string{"--timeout=0s"}, refusedHere: "`--timeout`, `--retry-interval-start` or `--capacity-poll-interval` 0 or less"},
		{args: []string{"--retry-interval-start=-1s"}, refusedHere: "`--timeout`, `--retry-interval-start` or `--capacity-poll-interval` 0 or less"},
		{args: []string{"--capacity-poll-interval=0s"}, refusedHere: "`--timeout`, `--retry-interval-start` or `--capacity-poll-interval` 0 or less"},
		{args: []string{"--snapshot-orphan-sweep-interval=-1s"}, refusedHere: "a negative `--snapshot-orphan-sweep-interval`"},
		{args: []string{"--retry-interval-start=10m"}, refusedHere: "`--retry-interval-start` above `--retry-interval-max`"},
		{args: []string{"--node-deployment-base-delay=2m"}, refusedHere: "`--node-deployment-base-delay` 0 or above `--node-deployment-max-delay`"},
		{args: []string{"--node-deployment-base-delay=0s"}, refusedHere: "`--node-deployment-base-delay` 0 or above `--node-deployment-max-delay`"},
		{args: []string{"--volume-name-uuid-length=0"}, refusedHere: "`--volume-name-uuid-length` 0 (every volume would be named `pvc-`) or above 32"},
		{args: []string{"--volume-name-uuid-length=40"}, refusedHere: "`--volume-name-uuid-length` 0 (every volume would be named `pvc-`) or above 32"},
		{args: []string{"--volume-name-prefix="}, refusedHere: "an empty `--volume-name-prefix`"},
		{args: []string{"--kube-api-qps=0"}, refusedHere: "`--kube-api-qps` or `--kube-api-capacity-qps` 0 (client-go would make it 5)"},
		{args: []string{"--kube-api-capacity-qps=0"}, refusedHere: "`--kube-api-qps` or `--kube-api-capacity-qps` 0 (client-go would make it 5)"},
		{args: []string{"--kube-api-burst=0"}, refusedHere: "or a burst of 0 with a positive QPS"},
		{args: []string{"--capacity-ownerref-level=-2"}, refusedHere: "`--capacity-ownerref-level` below -1"},
		{args: []string{"--metrics-path=metrics"}, refusedHere: "a `--metrics-path` that does not start with `/`, is one of the sidecar's own paths"},
		{args: []string{"--http-endpoint=:0", "--metrics-path=/readyz"}, refusedHere: "a `--metrics-path` that does not start with `/`, is one of the sidecar's own paths"},
		// Upstream runs (it panics only once it serves metrics).
		{args: []string{"--metrics-path=/a b"}, refusedHere: "is no path Go's HTTP server can serve"},
		// Upstream retries creating its Lease there for ever.
		{args: []string{"--leader-election", "--leader-election-namespace=Bad_NS"}, refusedHere: "a `--leader-election-namespace` that is no namespace name"},
		{args: []string{"--leader-election", "--leader-election-lease-duration=5s"}, refusedHere: "leader election timings client-go refuses"},
		{args: []string{"--leader-election-labels=a:b c"}, refusedHere: "`--leader-election-labels` items that are not a valid label key and value"},
		{args: []string{"--csi-address="}, refusedHere: "a `--csi-address` that is empty, a relative path or not a unix socket"},
		{args: []string{"--csi-address=csi.sock"}, refusedHere: "a `--csi-address` that is empty, a relative path or not a unix socket"},
		{args: []string{"--csi-address=tcp://127.0.0.1:10000"}, refusedHere: "a `--csi-address` that is empty, a relative path or not a unix socket"},
		{args: []string{"--node-deployment", "--leader-election"}, env: []string{"NODE_NAME=worker-1"}, refusedHere: "`--node-deployment` with `--leader-election` or `--enable-binder=true`"},
	}
}

// upstreamAccepted reports whether upstream took r's flags: it printed its
// help or version, or went on to build its client (which fails here).
func upstreamAccepted(r binRun) bool {
	return r.code == 0 || strings.Contains(r.stderr, "Failed to create config")
}

// oursAccepted is upstreamAccepted for this sidecar, which exits with
// status 1 when it cannot build its client.
func oursAccepted(r binRun) bool {
	return r.code == 0 || (r.code == 1 && strings.Contains(r.stderr, "build the Kubernetes client configuration"))
}

// TestUpstreamArgumentParity runs command lines (and environments) written
// for upstream through upstream's binary and ours, with no cluster to
// reach, and requires each that upstream takes to be taken here, or to be
// refused as README.md documents. A refusal here is one line and exit
// status 2.
func TestUpstreamArgumentParity(t *testing.T) {
	upstream, ours := parityBinaries(t)
	readme := readmeText(t)
	for _, row := range argRows() {
		t.Run(strings.Join(append(row.env, row.args...), " "), func(t *testing.T) {
			up, here := runBinary(t, upstream, row.env, row.args...), runBinary(t, ours, row.env, row.args...)
			upOK, hereOK := upstreamAccepted(up), oursAccepted(here)
			if !hereOK && (here.code != 2 || !oneLineError(here.stderr)) {
				t.Errorf("refused with exit %d and stderr %q, want exit 2 and one line \"csi-provisioner: ...\"", here.code, here.stderr)
			}
			switch {
			case row.refusedHere != "":
				if !strings.Contains(readme, row.refusedHere) {
					t.Errorf("README.md no longer says %q", row.refusedHere)
				}
				if !upOK || hereOK {
					t.Errorf("upstream accepted %t (exit %d), here %t (exit %d), want a documented refusal here: upstream %q, here %q",
						upOK, up.code, hereOK, here.code, up.stderr, here.stderr)
				}
			case upOK && !hereOK:
				t.Errorf("upstream accepts it (exit %d), here it is refused (and README.md does not say so): %s", up.code, here.stderr)
			case !upOK:
				t.Logf("upstream refuses it too (exit %d); here: accepted %t", up.code, hereOK)
			}
		})
	}
}
