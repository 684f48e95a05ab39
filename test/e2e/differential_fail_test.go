package e2e

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
)

// The test in this file checks the drop-in promise for provisioning that
// fails: the driver's CreateVolume answers with an error, or with a volume
// the sidecar cannot use, a few times, then succeeds. The cases are in
// differential_fail_cases_test.go.

// failCase is one claim whose CreateVolume the recording driver fails.
type failCase struct {
	diff diffCase
	// done says when the case has settled on one side; upstreamDone, if
	// set, on upstream's.
	done, upstreamDone func(st failState) bool
	// differ lists the deliberate differences, by key.
	differ map[string]delDiffer
	// ignore lists keys not compared (they depend on timing).
	ignore []string
	// then, if set, is done on each side once the case settled; the case
	// then settles again on thenDone and is compared again.
	then       func(s *diffSide, name string)
	thenDone   func(st failState) bool
	thenDiffer map[string]delDiffer
}

// failState is what a user and the driver see of one claim on one side.
type failState struct {
	// calls is the number of CreateVolume calls for the claim; changed:
	// a retry sent another request than the first (another name is
	// another volume, counted apart).
	calls   int
	changed bool
	// deletes is the number of DeleteVolume calls for the volume.
	deletes  int
	phase    string
	deleting bool
	selected bool
	// provisioner is the claim's volume.kubernetes.io/storage-provisioner.
	provisioner string
	pv          bool
	// warnings are the distinct "reason: message" of the Warning events,
	// normals the distinct reasons of the Normal ones.
	warnings, normals []string
}

func (st failState) keys() map[string]string {
	return map[string]string{
		"CreateVolume calls":   strconv.Itoa(st.calls),
		"request changed":      strconv.FormatBool(st.changed),
		"DeleteVolume calls":   strconv.Itoa(st.deletes),
		"phase":                st.phase,
		"deleting":             strconv.FormatBool(st.deleting),
		"selected-node":        strconv.FormatBool(st.selected),
		"storage-provisioner":  st.provisioner,
		"pv":                   strconv.FormatBool(st.pv),
		"warnings":             "[" + strings.Join(st.warnings, ", ") + "]",
		"normal event reasons": "[" + strings.Join(st.normals, ", ") + "]",
	}
}

// TestDifferentialCreateVolumeFailures provisions each case's claim with
// upstream external-provisioner v6.3.0 next to kube-controller-manager's
// binder (a control plane of its own) and with this sidecar and its binder
// (the shared control plane), each against a recording driver scripted by
// the class to fail CreateVolume. Once the case settles on both sides
// (bound after the driver recovered, or the selected node removed) the test
// compares the number of CreateVolume (and DeleteVolume) calls, whether the
// retries repeated the same request, the claim's phase and annotations,
// whether a PV was created, and the Warning events (reason and message) and
// the reasons of the Normal ones. A difference is a failure unless the case
// lists it with its reason.
func TestDifferentialCreateVolumeFailures(t *testing.T) {
	cp := controlplane.Need(t, shared)
	upBin, ourBin := diffBinaries(t)
	kcm := controlplane.StartForTest(t, controlplane.ReferenceBinderConfig())
	for _, c := range []*controlplane.ControlPlane{cp, kcm} {
		if err := e2e.InstallSnapshotCRDs(t.Context(), c.AdminConfig()); err != nil {
			t.Fatal(err)
		}
	}
	cases := failCases()
	g := diffGroup{name: "fail"}
	for _, c := range cases {
		g.cases = append(g.cases, c.diff)
	}
	up := startDiffSide(t, kcm, "upstream", upBin, g)
	ours := startDiffSide(t, cp, "ours", ourBin, g)
	up.create()
	ours.create()
	for _, c := range cases {
		t.Run(c.diff.name, func(t *testing.T) {
			upDone := c.done
			if c.upstreamDone != nil {
				upDone = c.upstreamDone
			}
			u, o := up.failSettle(t, c.diff.name, upDone), ours.failSettle(t, c.diff.name, c.done)
			for _, msg := range compareFail(c.differ, c.ignore, u, o) {
				t.Error(msg)
			}
			t.Logf("upstream: %v", u.keys())
			t.Logf("ours:     %v", o.keys())
			if c.then == nil {
				return
			}
			c.then(up, c.diff.name)
			c.then(ours, c.diff.name)
			u, o = up.failSettle(t, c.diff.name, c.thenDone), ours.failSettle(t, c.diff.name, c.thenDone)
			for _, msg := range compareFail(c.thenDiffer, c.ignore, u, o) {
				t.Error("then: " + msg)
			}
			t.Logf("then upstream: %v", u.keys())
			t.Logf("then ours:     %v", o.keys())
		})
	}
}

// compareFail reports every key not ignored whose value differs between
// the sides and is not a deliberate difference, and every deliberate
// difference that is not what the case says.
func compareFail(differ map[string]delDiffer, ignore []string, up, ours failState) []string {
	var errs []string
	u, o := up.keys(), ours.keys()
	for _, k := range slices.Sorted(maps.Keys(u)) {
		if slices.Contains(ignore, k) {
			continue
		}
		if d, ok := differ[k]; ok {
			if u[k] != d.upstream || o[k] != d.ours {
				errs = append(errs, fmt.Sprintf("%s: expected difference (%s) is now\n\tupstream: %s\n\tours:     %s", k, d.why, u[k], o[k]))
			}
			continue
		}
		if u[k] != o[k] {
			errs = append(errs, fmt.Sprintf("%s:\n\tupstream: %s\n\tours:     %s", k, u[k], o[k]))
		}
	}
	return errs
}

// failSettle waits until the case is done on this side and returns its
// state.
func (s *diffSide) failSettle(t *testing.T, name string, done func(failState) bool) failState {
	var st failState
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := s.failState(ctx, name)
		if err != nil {
			return false, nil
		}
		st = got
		return done(st), nil
	})
	if err != nil {
		t.Errorf("%s: %s did not settle: %v; last state: %v", s.ns, name, err, st.keys())
	}
	return st
}

// eventCallPrefix is what this sidecar puts before the driver's error in an
// event (README, "HTTP endpoints and metrics": a message about a failed
// CSI call names the call and the volume); upstream has the gRPC error
// alone.
var eventCallPrefix = regexp.MustCompile(`CreateVolume "[^"]*": `)

// failState reads the state of the case's claim on this side.
func (s *diffSide) failState(ctx context.Context, name string) (failState, error) {
	st := failState{phase: "gone"}
	claim, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		st.phase = string(claim.Status.Phase)
		st.deleting = claim.DeletionTimestamp != nil
		_, st.selected = claim.Annotations[selectedNodeAnn]
		st.provisioner = s.normalise(claim.Annotations["volume.kubernetes.io/storage-provisioner"])
	case !apierrors.IsNotFound(err):
		return st, err
	}
	uid := s.claims[name].UID
	if _, err := s.c.CoreV1().PersistentVolumes().Get(ctx, "pvc-"+string(uid), metav1.GetOptions{}); err == nil {
		st.pv = true
	} else if !apierrors.IsNotFound(err) {
		return st, err
	}
	volume := "pvc-" + string(uid)
	s.driver.mu.Lock()
	st.calls, st.changed = s.driver.creates[volume], s.driver.changed[volume]
	for _, req := range s.driver.deletes {
		if req.GetVolumeId() == "id-"+volume {
			st.deletes++
		}
	}
	s.driver.mu.Unlock()
	list, err := s.c.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(uid)})
	if err != nil {
		return st, err
	}
	for _, e := range list.Items {
		if e.Type == corev1.EventTypeWarning {
			if classRaced(ctx, s.c, e) {
				continue
			}
			w := s.normalise(e.Reason + ": " + eventCallPrefix.ReplaceAllString(e.Message, ""))
			if !slices.Contains(st.warnings, w) {
				st.warnings = append(st.warnings, w)
			}
			continue
		}
		// Posted by kube-controller-manager at each of its syncs, and by
		// this sidecar's binder only for a claim Pending for a minute
		// (README comparison table).
		if e.Reason != "ExternalProvisioning" && !slices.Contains(st.normals, e.Reason) {
			st.normals = append(st.normals, e.Reason)
		}
	}
	slices.Sort(st.warnings)
	slices.Sort(st.normals)
	return st, nil
}

// failClass scripts the class's CreateVolume: times failures with code (a
// gRPC code name), or times answers (see paramFailAnswer) when code is "".
func failClass(code string, times int, answer string) func(*storagev1.StorageClass) {
	kv := []string{paramFailTimes, strconv.Itoa(times)}
	if code != "" {
		kv = append(kv, paramFailCode, code)
	}
	if answer != "" {
		kv = append(kv, paramFailAnswer, answer)
	}
	return params(kv...)
}
