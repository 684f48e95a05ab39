package e2e

import (
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// The cases of TestDifferentialCreateVolumeFailures.

// recovered: the claim is Bound after the driver's scripted failures,
// with a Warning, and the provisioning library's events of the success are
// written (they can come after the bind).
func recovered(st failState) bool {
	return st.phase == "Bound" && st.pv && len(st.warnings) > 0 && slices.Contains(st.normals, "ProvisioningSucceeded")
}

// recoveredAfter: recovered, with n distinct Warnings (one per failed call:
// the script numbers its failures).
func recoveredAfter(n int) func(failState) bool {
	return func(st failState) bool { return recovered(st) && len(st.warnings) >= n }
}

// rescheduled: the selected node is gone from the claim, with a Warning.
func rescheduled(st failState) bool {
	return !st.selected && len(st.warnings) > 0
}

func hasWarning(reason string) func(failState) bool {
	return func(st failState) bool {
		return slices.ContainsFunc(st.warnings, func(w string) bool { return strings.HasPrefix(w, reason+": ") })
	}
}

// provisioned: a PV was created, with the library's success event.
func provisioned(st failState) bool {
	return st.pv && slices.Contains(st.normals, "ProvisioningSucceeded")
}

// overflowWhy is the reason of the overflow case's differences.
const overflowWhy = "README comparison table: a claim requesting more than the largest int64 bytes gets a Warning and no CreateVolume"

// deleteFailClaim deletes the case's claim.
func deleteFailClaim(s *diffSide, name string) {
	if err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(s.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

// existsWhy is the reason of the exists-deleted case's differences.
const existsWhy = "README comparison table: a claim deleted while CreateVolume answers ALREADY_EXISTS keeps the in-flight finalizer"

// noIDWhy is the reason of the no-id case's differences.
const noIDWhy = "README comparison table: a CreateVolume answer no PV can record is retried with a Warning"

func failCases() []failCase {
	fails := func(name, code string, times int, claim func(*testutil.PVCBuilder), done func(failState) bool) failCase {
		return failCase{diff: diffCase{name: name, fails: true, class: failClass(code, times, ""), claim: claim}, done: done}
	}
	clone := func(b *testutil.PVCBuilder) { b.Size("2Gi").DataSource(nil, "PersistentVolumeClaim", "src") }
	return []failCase{
		// Final answers: the library retries with backoff (an infeasible
		// one, InvalidArgument, after a slower delay) until the driver
		// succeeds.
		// Infeasible: the library delays the next call by its default
		// --retry-interval-max (5 minutes, whatever the flag says): the
		// case settles on the Warning.
		fails("invalid-argument", "INVALID_ARGUMENT", 2, nil, hasWarning("ProvisioningFailed")),
		fails("internal", "INTERNAL", 2, nil, recoveredAfter(2)),
		fails("out-of-range", "OUT_OF_RANGE", 2, nil, recoveredAfter(2)),
		fails("unimplemented", "UNIMPLEMENTED", 2, nil, recoveredAfter(2)),
		fails("failed-precondition", "FAILED_PRECONDITION", 2, nil, recoveredAfter(2)),
		fails("already-exists", "ALREADY_EXISTS", 2, nil, recoveredAfter(2)),
		fails("exhausted-immediate", "RESOURCE_EXHAUSTED", 2, nil, recoveredAfter(2)),
		// The clone's source is not found in the backend, for a while.
		fails("clone", "NOT_FOUND", 2, clone, recoveredAfter(2)),
		// In progress: retried with the same request.
		fails("unavailable", "UNAVAILABLE", 2, nil, recoveredAfter(2)),
		fails("deadline", "DEADLINE_EXCEEDED", 2, nil, recoveredAfter(2)),
		fails("aborted", "ABORTED", 2, nil, recoveredAfter(2)),
		fails("canceled", "CANCELLED", 2, nil, recoveredAfter(2)),
		// A final answer for a claim with a selected node: the library
		// removes the node (reschedule) only for RESOURCE_EXHAUSTED.
		{diff: diffCase{name: "exhausted-wffc", fails: true, class: both(wffc, failClass("RESOURCE_EXHAUSTED", 1, "")), claim: onNode("diff-n1")}, done: rescheduled},
		{diff: diffCase{name: "internal-wffc", fails: true, class: both(wffc, failClass("INTERNAL", 2, "")), claim: onNode("diff-n1")}, done: recoveredAfter(2)},
		{diff: diffCase{name: "unavailable-wffc", fails: true, class: both(wffc, failClass("UNAVAILABLE", 2, "")), claim: onNode("diff-n1")}, done: recoveredAfter(2)},
		// A claim deleted while CreateVolume keeps failing with a final
		// answer goes, and no volume is made.
		{
			diff:     diffCase{name: "deleted", fails: true, class: failClass("INTERNAL", 1000, "")},
			done:     hasWarning("ProvisioningFailed"),
			then:     deleteFailClaim,
			thenDone: func(st failState) bool { return st.phase == "gone" },
			// The retries (their number and their events) depend on
			// when the case is looked at.
			ignore: []string{"CreateVolume calls", "warnings", "normal event reasons"},
		},
		// ALREADY_EXISTS: the driver has a volume of this name with
		// other parameters. Upstream lets the claim go and the volume
		// stay; this sidecar keeps the claim, with a Warning that says
		// what to do.
		{
			diff:   diffCase{name: "exists-deleted", fails: true, class: failClass("ALREADY_EXISTS", 1000, "")},
			done:   hasWarning("ProvisioningFailed"),
			then:   deleteFailClaim,
			ignore: []string{"CreateVolume calls", "warnings", "normal event reasons"},
			thenDone: func(st failState) bool {
				return st.phase == "gone" || slices.ContainsFunc(st.warnings, func(w string) bool {
					return strings.Contains(w, "keeps finalizer csi-provisioner.kube-storage.io/provisioning")
				})
			},
			thenDiffer: map[string]delDiffer{
				"phase":               {"gone", "Pending", existsWhy},
				"deleting":            {"false", "true", existsWhy},
				"storage-provisioner": {"", "NS.diff.csi.kube-storage.io", existsWhy},
			},
		},
		// A volume smaller than requested is deleted again and the
		// create retried.
		{diff: diffCase{name: "small", fails: true, class: failClass("", 1, "small")}, done: recovered},
		// A volume without volume_id: upstream records it in a PV that
		// the API server refuses, retried in the background for ever.
		{diff: diffCase{name: "no-id", fails: true, class: failClass("", 1, "noid")}, done: func(st failState) bool {
			return recovered(st)
		}, upstreamDone: func(st failState) bool {
			return st.calls == 1 && slices.Contains(st.normals, "Provisioning")
		}, differ: map[string]delDiffer{
			"CreateVolume calls":   {"1", "2", noIDWhy},
			"phase":                {"Pending", "Bound", noIDWhy},
			"pv":                   {"false", "true", noIDWhy},
			"normal event reasons": {"[Provisioning]", "[Provisioning, ProvisioningSucceeded]", noIDWhy},
			"warnings":             {"[]", "[ProvisioningFailed: driver returned no volume ID]", noIDWhy},
		}},
		// More bytes than an int64 holds: upstream asks for the driver's
		// default size, and kube-controller-manager does not bind the
		// smaller PV to the claim.
		{diff: diffCase{name: "overflow", fails: true, claim: func(b *testutil.PVCBuilder) { b.Size("10E") }}, done: hasWarning("ProvisioningFailed"),
			upstreamDone: provisioned, differ: map[string]delDiffer{
				"CreateVolume calls":   {"1", "0", overflowWhy},
				"pv":                   {"true", "false", overflowWhy},
				"normal event reasons": {"[Provisioning, ProvisioningSucceeded]", "[Provisioning]", overflowWhy},
				"warnings":             {"[]", "[ProvisioningFailed: requested size 10E is more than the 9223372036854775807 bytes a CSI CreateVolume request can carry]", overflowWhy},
			}},
	}
}
