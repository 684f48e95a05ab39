package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// kcmEventSource is the source component of kube-controller-manager's
// persistentvolume-binder events.
const kcmEventSource = "persistentvolume-controller"

// TestBinderDifferentialCoexist applies the scenarios of
// [TestBinderDifferential] to one control plane where
// kube-controller-manager's persistentvolume-binder runs (1 s sync period,
// unthrottled), twice: for a driver only that binder serves ("kcm"), and
// for a driver our binder serves too ("both", the usual cluster, where the
// two binders work on the same claims and volumes at once). After each step
// both sides settle and what a user sees is compared as in
// TestBinderDifferential; a difference is a failure unless
// [coexistDiffers] lists it with its reason. Beyond the comparison it
// checks, on the "both" side:
//
//   - no fight: once the visible state is settled, no claim or volume is
//     written any more (resourceVersion unchanged over three resyncs), no
//     event of our binder is posted again, and no event of
//     kube-controller-manager keeps being posted that it posts at most once
//     on the "kcm" side;
//   - once settled, a Bound claim's volume names it with its UID and a Bound
//     volume's claim names it;
//   - over the whole watch history, no volume is named by two Bound claims
//     at once, unless that happens on the "kcm" side too (a hand edit of a
//     scenario can cause it there).
func TestBinderDifferentialCoexist(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.ReferenceBinderConfig())
	kcm := &diffSide{name: "kcm", e: newEnv(t, cp)}
	both := &diffSide{name: "both", e: newEnv(t, cp)}
	rb := both.e.startBinder(binderConfig{})
	hist := recordHistory(t, cp.Client(), "")

	scenarios := diffScenarios()
	differs, normalizers := coexistDiffers(), coexistNormalizers()
	var bothCases, kcmCases, all []*diffCase
	for i := range scenarios {
		scenarios[i].differ = differs[scenarios[i].name]
		b, k := newDiffCase(t, both, scenarios[i].name), newDiffCase(t, kcm, scenarios[i].name)
		bothCases, kcmCases = append(bothCases, b), append(kcmCases, k)
	}
	all = append(append(all, bothCases...), kcmCases...)
	steps := 0
	for i, sc := range scenarios {
		steps = max(steps, len(sc.steps))
		if sc.pvs != nil {
			sc.pvs(bothCases[i])
			sc.pvs(kcmCases[i])
		}
	}
	settleCoexist(t, rb, all, -1)
	for step := range steps {
		for i, sc := range scenarios {
			if step < len(sc.steps) {
				sc.steps[step](bothCases[i])
				sc.steps[step](kcmCases[i])
			}
		}
		states := settleCoexist(t, rb, all, step)
		for i, sc := range scenarios {
			if step >= len(sc.steps) {
				continue
			}
			o, k := states[i], states[len(scenarios)+i]
			if sc.normalize != nil {
				sc.normalize(o)
				sc.normalize(k)
			}
			if n := normalizers[sc.name]; n != nil {
				n(o)
			}
			msgs := compareDiff(&scenarios[i], step, o, k)
			for _, msg := range msgs {
				t.Error(strings.Replace(msg, "\tours:", "\tboth:", 1))
			}
			if len(msgs) > 0 {
				bothCases[i].logEvents()
				kcmCases[i].logEvents()
			}
		}
	}

	// Two Bound claims naming one volume at once, by scenario and volume id.
	doubles := func(cases []*diffCase) map[string]bool {
		out := map[string]bool{}
		for _, v := range hist.doubleBound() {
			for _, c := range cases {
				if id, ok := strings.CutPrefix(v, c.e.ns+"-"); ok {
					out[c.scenario+" pv/"+id] = true
				}
			}
		}
		return out
	}
	kcmDoubles := doubles(kcmCases)
	for _, v := range slices.Sorted(maps.Keys(doubles(bothCases))) {
		// An administrator moved the claimRef of a Bound volume to another
		// claim: kube-controller-manager binds the claim named, and marks
		// the old one Lost before or after that, as the order of its syncs
		// falls, so either side may show both Bound for a moment (seen on
		// the "both" side only, once in a CI run).
		if strings.HasPrefix(v, "claimref-moved ") {
			continue
		}
		if !kcmDoubles[v] {
			t.Errorf("%s: two claims were Bound to the volume at once", v)
		}
	}
	if errs := hist.watchErrors(); len(errs) > 0 {
		t.Errorf("watch errors (the history may have gaps): %v", errs)
	}

	// Both binders did write the "both" side's volumes (kube-controller-
	// manager's pv-protection writes only metadata, its binder the status).
	pvs, err := cp.Client().CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writers := map[string]int{}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != both.e.driver {
			continue
		}
		for _, m := range pv.ManagedFields {
			writers[m.Manager+"/"+m.Subresource]++
		}
	}
	t.Logf("field managers of the volumes on the both side: %v", writers)
	if writers["kube-controller-manager/status"] == 0 || writers[binder.FieldManager+"/status"] == 0 {
		t.Errorf("both binders should have written volume status on the both side: %v", writers)
	}
}

// coexistDiffers are the known differences between both binders and
// kube-controller-manager's alone, by scenario: where our binder's
// documented behaviour differs, the "both" side shows ours (ours is the
// binder that acts on these; kube-controller-manager's then agrees).
func coexistDiffers() map[string][]diffExpected {
	return map[string][]diffExpected{
		"prebound-claim": {wantMissingDiffers(0), wantMissingDiffers(1)},
		"bound-edits":    append(noUIDDiffers(1), noUIDDiffers(2)...),
	}
}

// coexistNormalizers rewrite the state of the "both" side of a scenario
// where the race between the two binders allows either outcome.
func coexistNormalizers() map[string]func(diffState) {
	return map[string]func(diffState){
		// An admin moves a Bound volume's claimRef to another claim:
		// kube-controller-manager binds the volume to the claim named
		// (upstream), whatever our binder says. Ours may first post
		// VolumeStillInUse on the volume moved by name (its guard, see
		// movedByNameDiffers) and kube-controller-manager may post
		// ClaimMisbound on the claim our binder bound to the volume moved
		// with a UID, when it sees that claim bound before its copy of the
		// volume has the new claimRef: both are past warnings of a moment,
		// the end state is kube-controller-manager's.
		"claimref-moved": func(s diffState) {
			dropEvent(s, "pv/name", "Warning VolumeStillInUse")
			dropEvent(s, "claim/to-uid", "Warning ClaimMisbound")
		},
		// An admin removes the UID from a Bound volume's claimRef: ours
		// binds the claim again (noUIDDiffers), but kube-controller-
		// manager's claim sync (every second here) may run first and
		// mark the claim Lost with ClaimMisbound; ours then binds it
		// again, and the end state is ours.
		"bound-edits": func(s diffState) {
			dropEvent(s, "claim/nouid", "Warning ClaimMisbound")
		},
		// A volume out of our binder's scope fits: kube-controller-
		// manager's binder binds it, ours waits, and says so only when
		// that takes longer than its provisioning grace (2 s here, as
		// the resync is 1 s), which a loaded machine can make happen.
		"foreign-volume": func(s diffState) {
			dropEvent(s, "claim/data", "Normal ExternalBinding")
			dropEvent(s, "claim/reserved", "Normal ExternalBinding")
		},
	}
}

// dropEvent removes an event reason from the state of key.
func dropEvent(s diffState, key, reason string) {
	v := s[key]
	for _, sep := range []string{reason + ",", "," + reason, reason} {
		if strings.Contains(v, sep) {
			s[key] = strings.Replace(v, sep, "", 1)
			return
		}
	}
}

// coexistSnap is one look at a case: what a user sees, the resourceVersion
// of each claim and volume, and the count of each event by source.
type coexistSnap struct {
	state    diffState
	versions map[string]string
	events   map[string]int32
	bad      []string
	// savingConflict: keys whose only ProvisioningFailed events are
	// kube-controller-manager's "Error saving claim" (see
	// dropSavingConflicts).
	savingConflict map[string]bool
}

func (c *diffCase) coexistSnap(ctx context.Context) (coexistSnap, error) {
	s, err := c.state(ctx)
	if err != nil {
		return coexistSnap{}, err
	}
	cl := c.e.c.CoreV1()
	pvs, err := cl.PersistentVolumes().List(ctx, metav1.ListOptions{LabelSelector: diffNSLabel + "=" + c.e.ns})
	if err != nil {
		return coexistSnap{}, err
	}
	claims, err := cl.PersistentVolumeClaims(c.e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return coexistSnap{}, err
	}
	evs, err := cl.Events(c.e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return coexistSnap{}, err
	}
	snap := coexistSnap{state: s, versions: map[string]string{}, events: map[string]int32{}, savingConflict: map[string]bool{}}
	keyOf := map[types.UID]string{}
	for _, pv := range pvs.Items {
		key := "pv/" + pv.Labels[diffIDLabel]
		snap.versions[key], keyOf[pv.UID] = pv.ResourceVersion, key
	}
	for _, pvc := range claims.Items {
		key := "claim/" + pvc.Name
		snap.versions[key], keyOf[pvc.UID] = pvc.ResourceVersion, key
	}
	// Events of volumes are in namespace default.
	pvEvs, err := cl.Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		return coexistSnap{}, err
	}
	for _, ev := range append(evs.Items, pvEvs.Items...) {
		key, ok := keyOf[ev.InvolvedObject.UID]
		if !ok {
			continue
		}
		snap.events[key+" "+ev.Source.Component+" "+ev.Type+" "+ev.Reason] += max(ev.Count, 1)
		if ev.Reason == "ProvisioningFailed" {
			conflict, seen := snap.savingConflict[key]
			snap.savingConflict[key] = (conflict || !seen) && ev.Source.Component == kcmEventSource &&
				strings.HasPrefix(ev.Message, "Error saving claim: Operation cannot be fulfilled")
		}
	}
	snap.bad = bindingViolations(pvs.Items, claims.Items)
	return snap, nil
}

// bindingViolations checks a settled state: a Bound claim's volume names it
// with its UID, and a Bound volume's claim names the volume.
func bindingViolations(pvs []corev1.PersistentVolume, claims []corev1.PersistentVolumeClaim) []string {
	var bad []string
	byName := map[string]*corev1.PersistentVolume{}
	for i := range pvs {
		byName[pvs[i].Name] = &pvs[i]
	}
	claimByName := map[string]*corev1.PersistentVolumeClaim{}
	for i := range claims {
		c := &claims[i]
		claimByName[c.Name] = c
		if c.Status.Phase != corev1.ClaimBound {
			continue
		}
		pv := byName[c.Spec.VolumeName]
		if pv == nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != c.Name || pv.Spec.ClaimRef.UID != c.UID {
			bad = append(bad, fmt.Sprintf("claim %s is Bound to %s, which does not name it with its UID", c.Name, c.Spec.VolumeName))
		}
	}
	for i := range pvs {
		pv := &pvs[i]
		if pv.Status.Phase != corev1.VolumeBound || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != pv.Labels[diffNSLabel] {
			continue
		}
		if c := claimByName[pv.Spec.ClaimRef.Name]; c == nil || c.Spec.VolumeName != pv.Name {
			bad = append(bad, fmt.Sprintf("volume %s is Bound to claim %s, which does not name it", pv.Name, pv.Spec.ClaimRef.Name))
		}
	}
	return bad
}

// settleCoexist waits until every case is ready and its visible state is
// unchanged over three resyncs of our binder, and returns the states, as
// settleBoth does. Then it checks the "both" cases (the first half) for
// fights: a claim or volume written again while nothing visible changes,
// in four windows of three resyncs in a row (one-off writes, such as the
// Unused condition, pass sooner), an event of our binder posted again, an
// event of kube-controller-manager posted again that it posts at most once
// on the "kcm" side; and for settled bindings that do not point both ways.
func settleCoexist(t *testing.T, rb *runningBinder, cases []*diffCase, step int) []diffState {
	t.Helper()
	snap := func() ([]coexistSnap, bool) {
		out := make([]coexistSnap, len(cases))
		ok := true
		for i, c := range cases {
			s, err := c.coexistSnap(t.Context())
			if err != nil {
				t.Fatalf("state of %s on %s: %v", c.scenario, c.side, err)
			}
			out[i], ok = s, ok && s.state.ready()
		}
		return out, ok
	}
	sameStates := func(a, b []coexistSnap) bool {
		return slices.EqualFunc(a, b, func(x, y coexistSnap) bool { return maps.Equal(x.state, y.state) })
	}
	sameVersions := func(a, b []coexistSnap) bool {
		return slices.EqualFunc(a, b, func(x, y coexistSnap) bool { return maps.Equal(x.versions, y.versions) })
	}
	deadline := time.Now().Add(2 * time.Minute)
	prev, _ := snap()
	quietRounds := 0
	for {
		rb.waitResyncs(t, 3)
		cur, ready := snap()
		switch {
		case !ready || !sameStates(prev, cur):
			quietRounds = 0
		case sameVersions(prev, cur):
			checkCoexistSettled(t, cases, step, prev, cur)
			return states(cur)
		default:
			quietRounds++
			if quietRounds >= 4 {
				for i, c := range cases {
					for k, v := range cur[i].versions {
						if prev[i].versions[k] != v {
							t.Errorf("step %d: %s on %s: %s keeps being written with no visible change (fight)", step, c.scenario, c.side, k)
						}
					}
				}
				checkCoexistSettled(t, cases, step, prev, cur)
				return states(cur)
			}
		}
		if time.Now().After(deadline) {
			for i, c := range cases {
				for k, v := range cur[i].state {
					if prev[i].state[k] != v {
						t.Errorf("step %d: %s on %s: %s keeps changing: %s -> %s", step, c.scenario, c.side, k, prev[i].state[k], v)
					}
				}
			}
			t.Fatalf("step %d: the scenarios did not settle", step)
		}
		prev = cur
	}
}

// states returns the states of snaps, with dropSavingConflicts applied to
// the "both" side (the first half).
func states(snaps []coexistSnap) []diffState {
	out := make([]diffState, len(snaps))
	for i := range snaps {
		out[i] = maps.Clone(snaps[i].state)
		if i < len(snaps)/2 {
			dropSavingConflicts(out[i], snaps[i].savingConflict)
		}
	}
	return out
}

// dropSavingConflicts removes the Warning ProvisioningFailed of a claim
// handed to the provisioner when it is only kube-controller-manager's
// "Error saving claim: Operation cannot be fulfilled ...": both binders set
// the storage-provisioner annotations of a new claim, and when ours writes
// between kube-controller-manager's read and its write, that binder posts
// this Warning once (README, comparison with upstream). A known difference
// that depends on timing; every other ProvisioningFailed still counts.
func dropSavingConflicts(s diffState, conflicts map[string]bool) {
	for key, only := range conflicts {
		if only && strings.Contains(s[key], " provisioner=true ") {
			dropEvent(s, key, "Warning ProvisioningFailed")
		}
	}
}

// checkCoexistSettled checks the events posted between two snapshots of a
// settled state and the bindings of the second, on the "both" side (the
// first half of cases; the second half is the "kcm" side, in the same
// order).
func checkCoexistSettled(t *testing.T, cases []*diffCase, step int, prev, cur []coexistSnap) {
	t.Helper()
	n := len(cases) / 2
	for i := range n {
		c := cases[i]
		for _, b := range cur[i].bad {
			t.Errorf("step %d: %s: %s", step, c.scenario, b)
		}
		// kube-controller-manager posts some events at each sync (count
		// raised, until its spam filter stops it after 25): those it
		// posts more than once alone may keep growing.
		kcmRepeats := map[string]bool{}
		for k, v := range cur[n+i].events {
			if v > 1 {
				kcmRepeats[k] = true
			}
		}
		for k, v := range cur[i].events {
			if v <= prev[i].events[k] {
				continue
			}
			fields := strings.Fields(k)
			switch fields[1] {
			case binder.EventSourceComponent:
				if prev[i].events[k] == 0 {
					// Posted for the first time: ExternalProvisioning
					// after the provisioning grace.
					continue
				}
				t.Errorf("step %d: %s: our binder posted %s again once settled (%d -> %d)", step, c.scenario, k, prev[i].events[k], v)
			case kcmEventSource:
				if !kcmRepeats[k] {
					t.Errorf("step %d: %s: kube-controller-manager keeps posting %s only when our binder runs too (%d -> %d)", step, c.scenario, k, prev[i].events[k], v)
				}
			}
		}
	}
}

// doubleBound returns the names of the volumes that two claims, both
// Bound, named at once at some point of the history.
func (h *history) doubleBound() []string {
	boundTo := map[types.UID]string{} // claim UID -> volumeName while Bound
	seen := map[string]bool{}
	for _, s := range h.claimStates() {
		if s.event == watch.Deleted || s.phase != corev1.ClaimBound || s.volumeName == "" {
			delete(boundTo, s.uid)
			continue
		}
		boundTo[s.uid] = s.volumeName
		for uid, v := range boundTo {
			if uid != s.uid && v == s.volumeName {
				seen[v] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// logEvents logs the events of the case's claims and volumes, to explain a
// difference.
func (c *diffCase) logEvents() {
	c.t.Helper()
	for _, ns := range []string{c.e.ns, metav1.NamespaceDefault} {
		evs, err := c.e.c.CoreV1().Events(ns).List(c.t.Context(), metav1.ListOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		for _, ev := range evs.Items {
			if ns == c.e.ns || strings.HasPrefix(ev.InvolvedObject.Name, c.e.ns+"-") {
				c.t.Logf("%s on %s: event of %s %s: %s %s x%d from %s: %s", c.scenario, c.side, ev.InvolvedObject.Kind, ev.InvolvedObject.Name,
					ev.Type, ev.Reason, ev.Count, ev.Source.Component, ev.Message)
			}
		}
	}
}
