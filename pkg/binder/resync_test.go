package binder

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

// genState returns a random state of one claim ("c1", maybe absent), up to
// two volumes ("pv1", "pv2") and the classes, with a description. Half of
// the states are a settled binding with up to three random changes, so that
// states near "nothing to do" are well covered; the other half are drawn
// field by field.
func genState(r *rand.Rand) ([]runtime.Object, string) {
	pick := func(options ...string) string { return options[r.IntN(len(options))] }
	var desc []string
	note := func(format string, args ...any) { desc = append(desc, fmt.Sprintf(format, args...)) }

	var claim *corev1.PersistentVolumeClaim
	var pv1, pv2 *corev1.PersistentVolume

	if r.IntN(2) == 0 {
		// A settled binding of c1 and pv1 ...
		claim = claimB("c1").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").
			Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
		claim.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		pv1 = volumeB("pv1").Class("fast").BoundTo(claim).Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeBound).Obj()
		note("settled")
		// ... changed a little.
		for range r.IntN(4) {
			m := r.IntN(16)
			claimMutation := m == 0 || m == 4 || m == 5 || m == 6 || m == 8 || m == 9 || m == 11 || m == 14
			if (claimMutation && claim == nil) || (!claimMutation && pv1 == nil) ||
				((m == 2 || m == 15) && pv1.Spec.ClaimRef == nil) {
				continue
			}
			switch m {
			case 0:
				claim.Status.Phase = corev1.PersistentVolumeClaimPhase(pick("Pending", "Lost", ""))
			case 1:
				pv1.Status.Phase = corev1.PersistentVolumePhase(pick("Pending", "Available", "Released", "Failed"))
			case 2:
				pv1.Spec.ClaimRef.UID = types.UID(pick("", "uid-other"))
			case 3:
				pv1.Spec.ClaimRef = nil
			case 4:
				inflight.Add(claim, "")
			case 5:
				claim.Status.AccessModes = nil
			case 6:
				claim = nil
			case 7:
				pv1 = nil
			case 8:
				delete(claim.Annotations, annBindCompleted)
			case 9:
				claim.Spec.VolumeName = pick("", "pv2")
			case 10:
				pv1.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(pick("Retain", "Recycle", "Shred"))
			case 11:
				cls := pick("", "wait", "other", "ghost")
				claim.Spec.StorageClassName = &cls
			case 12:
				pv1.Spec.CSI.Driver = otherDriver
			case 13:
				metav1.SetMetaDataAnnotation(&pv1.ObjectMeta, annProvisionedBy, driver)
			case 14:
				claim.UID = "uid-c1-new"
			case 15:
				pv1.Spec.ClaimRef.Name = "other"
			}
			note("change-%d", m)
		}
	} else {
		b := claimB("c1").Class(pick("fast", "wait", "other", "ghost", "")).
			Phase(corev1.PersistentVolumeClaimPhase(pick("Pending", "Bound", "Lost")))
		if r.IntN(2) == 0 {
			b.VolumeName(pick("pv1", "pv2"))
		}
		if r.IntN(2) == 0 {
			b.Annotation(annBindCompleted, "yes")
		}
		if r.IntN(3) == 0 {
			b.Annotation(annBoundByCtrl, "yes")
		}
		if r.IntN(3) == 0 {
			b.Annotation(annProvisioner, driver).Annotation(annBetaProvisioner, driver)
		}
		if r.IntN(4) == 0 {
			b.Annotation(annSelectedNode, "node-1")
		}
		if r.IntN(4) == 0 {
			b.Finalizers(inflight.Finalizer)
		}
		if r.IntN(3) == 0 {
			b.Created(now.Add(-time.Hour))
		}
		if r.IntN(4) == 0 {
			b.Size("5Gi")
		}
		claim = b.Obj()
		if r.IntN(2) == 0 {
			claim.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		}
		if r.IntN(8) == 0 {
			claim = nil
		}

		vb := volumeB("pv1").Class(pick("fast", "wait", "other", "ghost", "")).
			Phase(corev1.PersistentVolumePhase(pick("Pending", "Available", "Bound", "Released", "Failed"))).
			ReclaimPolicy(corev1.PersistentVolumeReclaimPolicy(pick("Delete", "Retain", "Recycle", "Shred")))
		switch r.IntN(5) {
		case 0:
			vb.ClaimRef(ns, "c1", "")
		case 1:
			vb.ClaimRef(ns, "c1", "uid-c1")
		case 2:
			vb.ClaimRef(ns, "c1", "uid-older")
		case 3:
			vb.ClaimRef(ns, "other", "uid-other")
		}
		if r.IntN(3) == 0 {
			vb.Annotation(annBoundByCtrl, "yes")
		}
		if r.IntN(3) == 0 {
			vb.Annotation(annProvisionedBy, driver)
		}
		if r.IntN(4) == 0 {
			vb.Annotation(AnnBoundClaims, "uid-c1")
		}
		if r.IntN(6) == 0 {
			vb.Block()
		}
		if r.IntN(6) == 0 {
			vb.Size("100Mi")
		}
		pv1 = vb.Obj()
		if r.IntN(6) == 0 {
			pv1.Spec.CSI.Driver = otherDriver
		}
		if r.IntN(8) == 0 {
			pv1 = nil
		}
		note("random")
	}
	if r.IntN(3) == 0 {
		pv2 = volumeB("pv2").Class("fast").ClaimRef(ns, "c1", "uid-c1").Annotation(annBoundByCtrl, "yes").Phase(corev1.VolumeBound).Obj()
		note("pv2")
	}

	state := objs(classFast(), classWait(), classOther())
	if claim != nil {
		state = append(state, claim)
		note("claim=%s", describeClaim(claim))
	}
	if pv1 != nil {
		state = append(state, pv1)
		note("pv1=%s", describeVolume(pv1))
	}
	if pv2 != nil {
		state = append(state, pv2)
	}
	if r.IntN(4) == 0 {
		state = append(state, testutil.NewPod(ns, "p1", "", "c1"))
		note("pod")
	}
	return state, strings.Join(desc, " ")
}

func describeClaim(c *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("{class=%v volumeName=%q phase=%s uid=%s ann=%v fin=%v modes=%v}",
		ptrString(c.Spec.StorageClassName), c.Spec.VolumeName, c.Status.Phase, c.UID, c.Annotations, c.Finalizers, c.Status.AccessModes)
}

func describeVolume(pv *corev1.PersistentVolume) string {
	ref := "nil"
	if r := pv.Spec.ClaimRef; r != nil {
		ref = fmt.Sprintf("%s/%s@%s", r.Namespace, r.Name, r.UID)
	}
	return fmt.Sprintf("{class=%s ref=%s phase=%s policy=%s driver=%s ann=%v}",
		pv.Spec.StorageClassName, ref, pv.Status.Phase, pv.Spec.PersistentVolumeReclaimPolicy, pv.Spec.CSI.Driver, pv.Annotations)
}

func ptrString(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestNeedsWorkIsComplete is the proof that the selective resync misses
// nothing: over a large generated set of states, whenever syncClaim or
// syncVolume writes anything or reports an event, the object's needsWork
// predicate was true in that state. It runs twice: with the volumes of the
// states named as the tables name them, and named after claim UIDs with
// WithUIDNamedVolumes, so that they are left out of the binder's indexes.
func TestNeedsWorkIsComplete(t *testing.T) {
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("uidNamed=%v", named), func(t *testing.T) {
			const states = 3000
			r := rand.New(rand.NewPCG(1, 2))
			var acted, idle, skipped int
			for i := range states {
				state, desc := genState(r)
				if !named && r.IntN(4) == 0 {
					// Another claim bound to pv1, so that claimRefs
					// edited away from it (or to it) are covered. Not
					// with UID-named volumes: a claim bound to a volume
					// named after another claim's UID is outside what
					// WithUIDNamedVolumes assumes.
					other := claimB("other").Class("fast").VolumeName("pv1").Annotation(annBindCompleted, "yes").
						Phase(corev1.PersistentVolumeClaimPhase([]string{"Bound", "Lost"}[r.IntN(2)])).Obj()
					state = append(state, other)
					desc += " other=" + describeClaim(other)
				}
				var opts []Option
				pvNames := map[string]string{"pv1": "pv1", "pv2": "pv2"}
				if named {
					state, pvNames = uidNamed(state)
					opts = append(opts, WithUIDNamedVolumes(uidPrefix))
				}
				check := func(what string, need func(b *Binder) (bool, bool)) {
					f := newFixture(t, state, opts...)
					needs, exists := need(f.binder)
					if !exists {
						return
					}
					_, err := f.runSync(what)
					writes := writesOnly(f.actions())
					events := f.events.take()
					didSomething := len(writes) > 0 || len(events) > 0
					switch {
					case didSomething && !needs:
						t.Errorf("state %d (%s): %s needsWork = false, but its sync made writes %q and events %q (err %v)",
							i, desc, what, writes, events, err)
					case didSomething:
						acted++
					case !needs:
						skipped++
					default:
						idle++
					}
				}
				check("pvc/c1", func(b *Binder) (bool, bool) {
					c := b.getClaim(ns, "c1")
					if c == nil {
						return false, false
					}
					return b.claimNeedsWork(c), true
				})
				for _, name := range []string{pvNames["pv1"], pvNames["pv2"]} {
					check("pv/"+name, func(b *Binder) (bool, bool) {
						pv := b.getVolume(name)
						if pv == nil {
							return false, false
						}
						return b.volumeNeedsWork(pv), true
					})
				}
			}
			t.Logf("syncs that acted: %d; skipped by needsWork: %d; queued but idle: %d", acted, skipped, idle)
			// The generator must exercise both sides of the predicate.
			if acted < states/4 || skipped < states/4 {
				t.Errorf("generator too narrow: %d syncs acted, %d were skipped", acted, skipped)
			}
		})
	}
}

// uidPrefix is the volume name prefix of uidNamed.
const uidPrefix = "pvc"

// uidNamed returns a copy of a genState state whose volumes are named as the
// provisioner names them: pv1 after claim c1's first UID (so it is named
// after its claimRef when that names c1 with it), pv2 after an earlier
// claim's UID (named after a claimRef that is not its own). Claims naming a
// volume name the new name. It also returns the new names by old name.
func uidNamed(state []runtime.Object) ([]runtime.Object, map[string]string) {
	names := map[string]string{"pv1": uidPrefix + "-uid-c1", "pv2": uidPrefix + "-uid-older"}
	out := make([]runtime.Object, 0, len(state))
	for _, o := range state {
		switch x := o.(type) {
		case *corev1.PersistentVolume:
			x = x.DeepCopy()
			x.Name = names[x.Name]
			o = x
		case *corev1.PersistentVolumeClaim:
			x = x.DeepCopy()
			if n, ok := names[x.Spec.VolumeName]; ok {
				x.Spec.VolumeName = n
			}
			o = x
		}
		out = append(out, o)
	}
	return out, names
}

// TestResyncQueuesOnlyWork checks the resync on a typical idle cluster: a
// thousand settled bindings are not queued, the few objects that need work
// are.
func TestResyncQueuesOnlyWork(t *testing.T) {
	state := objs(classFast(), classOther(), testutil.NewSC("manual", otherDriver).Obj())
	for i := range 1000 {
		c := claimB(fmt.Sprintf("c%d", i)).Class("fast").VolumeName(fmt.Sprintf("pv%d", i)).
			Annotation(annBindCompleted, "yes").Annotation(annBoundByCtrl, "yes").Phase(corev1.ClaimBound).Obj()
		c.Status.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		pv := volumeB(fmt.Sprintf("pv%d", i)).Class("fast").BoundTo(c).Annotation(annProvisionedBy, driver).Phase(corev1.VolumeBound).Obj()
		state = append(state, c, pv)
	}
	// The claimRef of "moved" was edited by name from "owner", still bound
	// to it, to "misbound": both claims are Lost (Misbound), owner
	// recorded on the volume, and nothing changes until one of them goes,
	// so neither is queued.
	misbound := claimB("misbound").Class("fast").VolumeName("moved").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimLost).Obj()
	owner := claimB("owner").Class("fast").VolumeName("moved").Annotation(annBindCompleted, "yes").Phase(corev1.ClaimLost).Obj()
	state = append(state, misbound, owner,
		recordBoundClaims(volumeB("moved").Class("fast").ClaimRef(ns, "misbound", "").Phase(corev1.VolumeAvailable).Obj(), owner.UID))
	state = append(state,
		claimB("pending").Class("fast").Obj(),
		volumeB("static").Class("fast").Obj(),                          // Available: idle
		volumeB("new").Class("fast").Phase(corev1.VolumePending).Obj(), // needs Available
		volumeB("retained").ClaimRef(ns, "gone", "uid-gone").Phase(corev1.VolumeReleased). // idle
													ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).Obj(),
		testutil.NewPV("foreign", otherDriver).Phase(corev1.VolumePending).Obj(), // out of scope
		// Claims of another provisioner's classes: one may take our
		// unbound volume of its class, the other has none to take.
		claimB("manual").Class("manual").Obj(),
		volumeB("manual-static").Class("manual").Obj(),
		claimB("other").Class("other").Obj(),
	)
	f := newFixture(t, state)
	f.binder.resync(f.ctx)
	got := f.queued()
	slices.Sort(got) // the lister's order
	want := []string{"pv/new", "pvc/ns/manual", "pvc/ns/pending"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("resync queued %v, want %v", got, want)
	}
}

// TestUIDNamedVolumesBehaveAlike checks that leaving volumes named after
// their claim out of the indexes (WithUIDNamedVolumes) changes no sync: over
// the generated states, every sync writes the same and reports the same
// events whether the volumes are named as in the tables or after claim
// UIDs (names mapped back before comparing).
func TestUIDNamedVolumesBehaveAlike(t *testing.T) {
	const states = 3000
	r := rand.New(rand.NewPCG(3, 4))
	var compared int
	for i := range states {
		state, desc := genState(r)
		renamed, names := uidNamed(state)
		back := make([]string, 0, 2*len(names))
		for old, name := range names {
			back = append(back, name, old)
		}
		unname := strings.NewReplacer(back...)
		run := func(state []runtime.Object, what string, opts ...Option) (string, bool) {
			f := newFixture(t, state, opts...)
			kind, name, _ := strings.Cut(what, "/")
			if (kind == "pvc" && f.binder.getClaim(ns, name) == nil) || (kind == "pv" && f.binder.getVolume(name) == nil) {
				return "", false
			}
			res, err := f.runSync(what)
			return unname.Replace(fmt.Sprintf("writes %q events %q result %+v err %v",
				writesOnly(f.actions()), f.events.take(), res, err)), true
		}
		for _, what := range []string{"pvc/c1", "pv/pv1", "pv/pv2"} {
			plain, ok := run(state, what)
			if !ok {
				continue
			}
			kind, name, _ := strings.Cut(what, "/")
			if kind == "pv" {
				name = names[name]
			}
			named, _ := run(renamed, kind+"/"+name, WithUIDNamedVolumes(uidPrefix))
			compared++
			if plain != named {
				t.Errorf("state %d (%s): %s\n indexed:   %s\n uid-named: %s", i, desc, what, plain, named)
			}
		}
	}
	if compared < states {
		t.Errorf("only %d syncs compared", compared)
	}
}
