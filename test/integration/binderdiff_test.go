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

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// Labels that name a scenario's volumes independently of the side: the
// volume's id in its scenario, and the scenario's namespace (volumes are
// cluster-scoped).
const (
	diffIDLabel = "binderdiff.csi.example/id"
	diffNSLabel = "binderdiff.csi.example/ns"
)

// diffScenario is one case of the binder differential: steps applied in
// turn on each side, each followed by settling and a comparison.
type diffScenario struct {
	name string
	// pvs creates the scenario's volumes. All scenarios' volumes are
	// created, and seen by both binders, before the first step: a claim
	// created with its volumes may be synced before the binder's cache has
	// them (the watches are not ordered), on either side.
	pvs   func(c *diffCase)
	steps []func(c *diffCase)
	// normalize, if set, rewrites a side's state before the comparison
	// (for a result that depends on timing, such as which of two racing
	// claims wins).
	normalize func(s diffState)
	// differ lists the known differences of this scenario.
	differ []diffExpected
	// coexistOnly: the scenario's volumes are out of our binder's scope
	// (kube-controller-manager's binder alone manages them, their phase
	// included), so it runs in TestBinderDifferentialCoexist only.
	coexistOnly bool
}

// diffExpected is one deliberate difference: after step (0-based), the
// state of key is ours on our side and kcm on kube-controller-manager's.
type diffExpected struct {
	step      int
	key       string
	ours, kcm string
	why       string
}

// diffSide is one side of the differential: a control plane and the env of
// the binder that runs there.
type diffSide struct {
	name string
	e    *env
}

// diffCase is one scenario on one side, in a namespace of its own, with its
// own classes: sc (Immediate), other (Immediate, a class no claim uses) and
// wffc (WaitForFirstConsumer), all of the side's driver.
type diffCase struct {
	t               *testing.T
	e               env
	sc, other, wffc string
	claimUIDs       map[string]types.UID
	scenario, side  string
}

func newDiffCase(t *testing.T, side *diffSide, scenario string) *diffCase {
	t.Helper()
	e := *side.e
	e.ns = newNamespace(t, e.cp)
	c := &diffCase{t: t, e: e, scenario: scenario, side: side.name, claimUIDs: map[string]types.UID{}}
	c.sc = e.createClass(testutil.NewSC(e.name("sc"), e.driver)).Name
	c.other = e.createClass(testutil.NewSC(e.name("other"), e.driver)).Name
	c.wffc = e.createClass(testutil.NewSC(e.name("wffc"), e.driver).WaitForFirstConsumer()).Name
	return c
}

// pvName is the name of the scenario's volume id on this side.
func (c *diffCase) pvName(id string) string { return c.e.name(id) }

// pv starts the scenario's volume id: class sc, 1Gi, RWO, Filesystem, Delete.
func (c *diffCase) pv(id string) *testutil.PVBuilder {
	return testutil.NewPV(c.pvName(id), c.e.driver).Class(c.sc).Label(diffIDLabel, id).Label(diffNSLabel, c.e.ns)
}

// claim starts the scenario's claim name: class sc, 1Gi, RWO, Filesystem.
func (c *diffCase) claim(name string) *testutil.PVCBuilder {
	return testutil.NewPVC(c.e.ns, name).Class(c.sc)
}

func (c *diffCase) createPV(b *testutil.PVBuilder) { c.e.createPV(b) }

func (c *diffCase) createClaim(b *testutil.PVCBuilder) *corev1.PersistentVolumeClaim {
	created := c.e.createClaim(b)
	c.claimUIDs[created.Name] = created.UID
	return created
}

// diffState is what a user sees of one scenario on one side, by key
// ("claim/<name>", "pv/<id>"): phases, which volume a claim has (by the
// volume's id), claimRef, the annotations users read and the event reasons.
type diffState map[string]string

func (c *diffCase) state(ctx context.Context) (diffState, error) {
	cl := c.e.c.CoreV1()
	pvs, err := cl.PersistentVolumes().List(ctx, metav1.ListOptions{LabelSelector: diffNSLabel + "=" + c.e.ns})
	if err != nil {
		return nil, err
	}
	claims, err := cl.PersistentVolumeClaims(c.e.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	evs, err := cl.Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	reasons := map[types.UID][]string{}
	for _, ev := range evs.Items {
		r := ev.Type + " " + ev.Reason
		if !slices.Contains(reasons[ev.InvolvedObject.UID], r) {
			reasons[ev.InvolvedObject.UID] = append(reasons[ev.InvolvedObject.UID], r)
		}
	}
	events := func(uid types.UID) string {
		r := reasons[uid]
		slices.Sort(r)
		return "[" + strings.Join(r, ",") + "]"
	}
	ids := map[string]string{}
	for _, pv := range pvs.Items {
		ids[pv.Name] = pv.Labels[diffIDLabel]
	}
	uids := map[string]types.UID{}
	s := diffState{}
	for _, pvc := range claims.Items {
		uids[pvc.Name] = pvc.UID
		vol := pvc.Spec.VolumeName
		if id, ok := ids[vol]; ok {
			vol = id
		} else if vol != "" {
			vol = "?" + strings.TrimPrefix(vol, c.e.ns+"-")
		}
		size := pvc.Status.Capacity[corev1.ResourceStorage]
		s["claim/"+pvc.Name] = fmt.Sprintf("phase=%s volume=%s capacity=%s modes=%v bindCompleted=%t boundByController=%t provisioner=%t events=%s",
			pvc.Status.Phase, vol, size.String(), pvc.Status.AccessModes,
			metav1.HasAnnotation(pvc.ObjectMeta, annBindCompleted), metav1.HasAnnotation(pvc.ObjectMeta, annBoundByController),
			metav1.HasAnnotation(pvc.ObjectMeta, annStorageProv), events(pvc.UID))
	}
	for _, pv := range pvs.Items {
		ref := "none"
		if r := pv.Spec.ClaimRef; r != nil {
			ref = r.Name
			if r.Namespace != c.e.ns {
				ref = r.Namespace + "/" + r.Name
			}
			switch uid, ok := uids[r.Name]; {
			case r.UID == "":
				ref += "(no uid)"
			case ok && r.UID == uid:
				ref += "(uid)"
			case ok:
				ref += "(another uid)"
			default:
				ref += "(uid of a gone claim)"
			}
		}
		s["pv/"+pv.Labels[diffIDLabel]] = fmt.Sprintf("phase=%s claimRef=%s boundByController=%t events=%s",
			pv.Status.Phase, ref, metav1.HasAnnotation(pv.ObjectMeta, annBoundByController), events(pv.UID))
	}
	return s, nil
}

// ready says whether both binders have seen every volume (none Pending).
func (s diffState) ready() bool {
	for k, v := range s {
		if strings.HasPrefix(k, "pv/") && (strings.HasPrefix(v, "phase= ") || strings.HasPrefix(v, "phase=Pending ")) {
			return false
		}
	}
	return true
}

// settleBoth waits until every case on both sides is ready and unchanged
// over three resyncs of our binder (both binders resync every second, so
// that is at least two of kube-controller-manager's resyncs too, each of
// which syncs every claim and volume), and returns the states. This is how
// the test knows both sides are done: neither changes anything any more.
func settleBoth(t *testing.T, rb *runningBinder, cases []*diffCase) []diffState {
	t.Helper()
	snap := func() ([]diffState, bool) {
		out := make([]diffState, len(cases))
		ok := true
		for i, c := range cases {
			s, err := c.state(t.Context())
			if err != nil {
				t.Fatalf("state of %s on %s: %v", c.scenario, c.side, err)
			}
			out[i], ok = s, ok && s.ready()
		}
		return out, ok
	}
	deadline := time.Now().Add(2 * time.Minute)
	prev, _ := snap()
	for {
		rb.waitResyncs(t, 3)
		cur, ready := snap()
		if ready && slices.EqualFunc(prev, cur, func(a, b diffState) bool { return maps.Equal(a, b) }) {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scenarios did not settle; last states: %v", cur)
		}
		prev = cur
	}
}

// compareDiff reports every key whose state differs between ours and kcm,
// unless it is an expected difference of the step, and every expected
// difference that did not occur.
func compareDiff(sc *diffScenario, step int, ours, kcm diffState) []string {
	var errs []string
	keys := slices.Sorted(maps.Keys(ours))
	for k := range kcm {
		if _, ok := ours[k]; !ok {
			keys = append(keys, k)
		}
	}
	expected := map[string]diffExpected{}
	for _, d := range sc.differ {
		if d.step == step {
			expected[d.key] = d
		}
	}
	for _, k := range keys {
		o, b := ours[k], kcm[k]
		if d, ok := expected[k]; ok {
			delete(expected, k)
			if o != d.ours || b != d.kcm {
				errs = append(errs, fmt.Sprintf("%s step %d %s: expected difference (%s) is now\n\tours: %s\n\tkcm:  %s", sc.name, step, k, d.why, o, b))
			}
			continue
		}
		if o != b {
			errs = append(errs, fmt.Sprintf("%s step %d %s:\n\tours: %s\n\tkcm:  %s", sc.name, step, k, o, b))
		}
	}
	for k, d := range expected {
		errs = append(errs, fmt.Sprintf("%s step %d %s: expected difference (%s) not found", sc.name, step, k, d.why))
	}
	return errs
}

// TestBinderDifferential applies the same scenarios of static volumes and
// claims to two control planes: on the package's shared one only our binder
// (in this process) binds; on a second one only kube-controller-manager's
// persistentvolume-binder does (with a 1 s sync period, as our test
// binder's resync). No provisioner runs on either side. After each step of
// each scenario both sides settle (see settleBoth) and what a user sees is
// compared: which claim has which volume, phases, claimRef and its UID,
// bind-completed and bound-by-controller, the storage-provisioner
// annotation, the claim's status capacity and access modes, and the set of
// event reasons on each object (messages may differ). A difference is a
// failure unless the scenario lists it with its reason.
func TestBinderDifferential(t *testing.T) {
	cpA := controlplane.Need(t, shared)
	cpB := controlplane.StartForTest(t, controlplane.ReferenceBinderConfig())
	ours := &diffSide{name: "ours", e: newEnv(t, cpA)}
	kcm := &diffSide{name: "kcm", e: newEnv(t, cpB)}
	rb := ours.e.startBinder(binderConfig{})

	scenarios := slices.DeleteFunc(diffScenarios(), func(sc diffScenario) bool { return sc.coexistOnly })
	var oursCases, kcmCases, all []*diffCase
	for _, sc := range scenarios {
		o, k := newDiffCase(t, ours, sc.name), newDiffCase(t, kcm, sc.name)
		oursCases, kcmCases = append(oursCases, o), append(kcmCases, k)
	}
	all = append(append(all, oursCases...), kcmCases...)
	steps := 0
	for i, sc := range scenarios {
		steps = max(steps, len(sc.steps))
		if sc.pvs != nil {
			sc.pvs(oursCases[i])
			sc.pvs(kcmCases[i])
		}
	}
	settleBoth(t, rb, all)
	for step := range steps {
		for i, sc := range scenarios {
			if step < len(sc.steps) {
				sc.steps[step](oursCases[i])
				sc.steps[step](kcmCases[i])
			}
		}
		states := settleBoth(t, rb, all)
		for i, sc := range scenarios {
			if step >= len(sc.steps) {
				continue
			}
			o, k := states[i], states[len(scenarios)+i]
			if sc.normalize != nil {
				sc.normalize(o)
				sc.normalize(k)
			}
			for _, key := range slices.Sorted(maps.Keys(k)) {
				t.Logf("%s step %d %s: kcm: %s", sc.name, step, key, k[key])
			}
			for _, msg := range compareDiff(&scenarios[i], step, o, k) {
				t.Error(msg)
			}
		}
	}
}
