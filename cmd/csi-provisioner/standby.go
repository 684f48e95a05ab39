package main

import (
	"context"
	"os"
	"regexp"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/klog/v2"
)

// How often a replica that does not lead reads the Lease to say why, and
// how often it says it again while nothing changed.
const (
	standbyCheckEvery = 30 * time.Second
	standbyLogEvery   = 10 * time.Minute
)

// reportStandby tells, at level 0, why this replica provisions nothing:
// which process holds the Lease, or why the Lease cannot be read (RBAC, for
// one). client-go's elector says so only at -v=4, so with no replica able
// to lead (a stale holder, a Lease no replica may update) claims stayed
// Pending with nothing in any log. It first reads the Lease after first (a
// replica that can lead has led by then), then every every; it logs when
// what it found changed, and again every repeat while it stays. It returns
// when ctx is done or leading is closed.
func reportStandby(ctx context.Context, leases coordinationv1client.LeaseInterface, namespace, name string, leading <-chan struct{}, first, every, repeat time.Duration) {
	logger := klog.FromContext(ctx)
	ref := klog.KRef(namespace, name)
	var last string
	var logged time.Time
	timer := time.NewTimer(first)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-leading:
			return
		case <-timer.C:
		}
		timer.Reset(every)
		lease, err := leases.Get(ctx, name, metav1.GetOptions{})
		if ctx.Err() != nil {
			return
		}
		found := "holder " + holderOf(lease)
		if err != nil {
			found = "error " + err.Error()
		}
		if found == last && time.Since(logged) < repeat {
			continue
		}
		last, logged = found, time.Now()
		switch holder := holderOf(lease); {
		case err != nil:
			logger.Error(err, "Not leading: cannot read the leader election Lease; this replica provisions nothing until it holds it", "lease", ref)
		case holder == "":
			logger.Info("Not leading: the leader election Lease has no holder yet; this replica provisions nothing until it holds it", "lease", ref)
		default:
			var renewed any = "never"
			if rt := lease.Spec.RenewTime; rt != nil {
				renewed = rt.UTC()
			}
			logger.Info("Not leading: another process holds the leader election Lease; this replica provisions nothing until it holds it",
				"lease", ref, "holder", holder, "renewTime", renewed, "leaseDurationSeconds", lease.Spec.LeaseDurationSeconds)
		}
	}
}

// leaseNamespace is the namespace of the Lease, chosen as csi-lib-utils
// chooses it when given none (its function is not exported): the flag,
// else the pod's namespace (POD_NAMESPACE, else the service account's),
// else "default". runWithLeaderElection hands it to csi-lib-utils.
func leaseNamespace(flag string) string {
	if flag != "" {
		return flag
	}
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}

var leaseNameInvalid = regexp.MustCompile(`[^a-zA-Z0-9-]`)

// leaseName is the name of the Lease for driver, as upstream's (csi-lib-utils
// sanitizes the lock name so, unexported): every character but letters,
// digits and '-' becomes '-', and a name that would end with '-' gets an
// 'X'. The result is unchanged by csi-lib-utils' own sanitizing.
func leaseName(driver string) string {
	name := leaseNameInvalid.ReplaceAllString(driver, "-")
	if strings.HasSuffix(name, "-") {
		name += "X"
	}
	return name
}
