package integration

import (
	"strings"

	"github.com/kube-storage/csi-provisioner/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// diffScenarios are the cases of [TestBinderDifferential]. Names of
// volumes are ids (the side's name is derived from them), names of claims
// are the same on both sides.
func diffScenarios() []diffScenario {
	return []diffScenario{
		{name: "smallest-fit", pvs: func(c *diffCase) {
			for id, size := range map[string]string{"s1": "1Gi", "s3": "3Gi", "s5": "5Gi", "s10": "10Gi"} {
				c.createPV(c.pv(id).Size(size))
			}
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("data").Size("2Gi"))
		}}},
		{name: "access-modes", pvs: func(c *diffCase) {
			c.createPV(c.pv("rwo"))
			c.createPV(c.pv("all").AccessModes(rwo, rox, rwx))
			c.createPV(c.pv("rox").AccessModes(rox))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("want-rox").AccessModes(rox))
			c.createClaim(c.claim("want-rwo-rox").AccessModes(rwo, rox))
			c.createClaim(c.claim("want-rwop").AccessModes(corev1.ReadWriteOncePod))
		}}},
		{name: "volume-mode", pvs: func(c *diffCase) {
			c.createPV(c.pv("fs"))
			c.createPV(c.pv("blk").Block())
			c.createPV(c.pv("blk-pre").Block().ClaimRef(c.e.ns, "fs-pre", ""))
			c.createPV(c.pv("blk-named").Block().Size("2Gi")) // larger: equal sizes tie, and kcm breaks ties at random
		}, steps: []func(c *diffCase){
			func(c *diffCase) {
				c.createClaim(c.claim("want-blk").Block())
				c.createClaim(c.claim("want-fs"))
			},
			func(c *diffCase) {
				// A Filesystem claim pre-bound both ways to Block volumes.
				c.createClaim(c.claim("fs-pre"))
				c.createClaim(c.claim("fs-named").VolumeName(c.pvName("blk-named")))
			},
		}},
		{name: "selector", pvs: func(c *diffCase) {
			c.createPV(c.pv("labelled").Size("5Gi").Label("tier", "db"))
			c.createPV(c.pv("plain"))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("db").Selector(map[string]string{"tier": "db"}))
			c.createClaim(c.claim("cache").Selector(map[string]string{"tier": "cache"}))
		}}},
		{name: "empty-class", pvs: func(c *diffCase) {
			// The only scenario with class "" volumes: they match claims
			// of class "" of any namespace, so its claims select them by
			// namespace.
			c.createPV(c.pv("empty").Class(""))
			c.createPV(c.pv("classed"))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("empty").Class("").Selector(map[string]string{diffNSLabel: c.e.ns}))
			c.createClaim(c.claim("classed"))
			// Nothing fits it: kube-controller-manager's binder says so at
			// once, ours 1 to 3 s after its creation (its turn), which may
			// come after the step would have settled.
			none := c.createClaim(c.claim("empty-none").Class("").Selector(map[string]string{"none": "none"}))
			c.e.waitEvent(none.UID, corev1.EventTypeNormal, "FailedBinding", "no persistent volumes available for this claim and no storage class is set")
		}}},
		{name: "class-mismatch", pvs: func(c *diffCase) {
			c.createPV(c.pv("other").Class(c.other))
			c.createPV(c.pv("other-named").Class(c.other))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("data").Selector(map[string]string{diffIDLabel: "other"}))
			c.createClaim(c.claim("named").VolumeName(c.pvName("other-named")))
		}}},
		{name: "prebound-pv", pvs: func(c *diffCase) {
			c.createPV(c.pv("by-name").ClaimRef(c.e.ns, "by-name", ""))
			c.createPV(c.pv("to-ghost").ClaimRef(c.e.ns, "ghost", ""))
			c.createPV(c.pv("stale-uid").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).
				ClaimRef(c.e.ns, "stale", "00000000-0000-0000-0000-000000000001"))
		}, steps: []func(c *diffCase){
			func(c *diffCase) {
				c.createClaim(c.claim("by-name"))
				c.createClaim(c.claim("stale").Class(c.wffc))
				// A WaitForFirstConsumer claim is not provisioned, so it
				// waits for the volume created next with its UID.
				c.createClaim(c.claim("by-uid").Class(c.wffc))
			},
			func(c *diffCase) {
				c.createPV(c.pv("by-uid").Class(c.wffc).ClaimRef(c.e.ns, "by-uid", string(c.claimUIDs["by-uid"])))
			},
		}},
		{name: "prebound-claim", pvs: func(c *diffCase) {
			c.createPV(c.pv("avail"))
			c.createPV(c.pv("taken").Label("owner", "yes"))
			c.createPV(c.pv("small").Size("1Gi"))
		}, steps: []func(c *diffCase){
			func(c *diffCase) {
				c.createClaim(c.claim("owner").Selector(map[string]string{"owner": "yes"}))
				c.createClaim(c.claim("want-avail").VolumeName(c.pvName("avail")))
				c.createClaim(c.claim("want-missing").VolumeName(c.pvName("missing")))
				c.createClaim(c.claim("want-small").Size("2Gi").VolumeName(c.pvName("small")))
			},
			func(c *diffCase) {
				c.createClaim(c.claim("want-taken").VolumeName(c.pvName("taken")))
			},
		}, differ: []diffExpected{
			wantMissingDiffers(0), wantMissingDiffers(1),
		}},
		{name: "wffc", pvs: func(c *diffCase) {
			c.createPV(c.pv("node-a").Class(c.wffc).NodeAffinity(corev1.LabelHostname, "node-a"))
			c.createPV(c.pv("pre").Class(c.wffc).ClaimRef(c.e.ns, "pre", ""))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("wait").Class(c.wffc))
			c.createClaim(c.claim("selected").Class(c.wffc).Annotation(annSelectedNode, "node-a"))
			c.createClaim(c.claim("pre").Class(c.wffc))
		}}},
		{name: "reclaim", pvs: func(c *diffCase) {
			c.createPV(c.pv("retain").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).Label("pair", "retain"))
			c.createPV(c.pv("delete").Label("pair", "delete"))
			c.createPV(c.pv("clear").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).Label("pair", "clear"))
		}, steps: []func(c *diffCase){
			func(c *diffCase) {
				for _, n := range []string{"retain", "delete", "clear"} {
					c.createClaim(c.claim(n).Selector(map[string]string{"pair": n}))
				}
			},
			func(c *diffCase) {
				for _, n := range []string{"retain", "delete", "clear"} {
					c.e.deleteClaim(n)
				}
			},
			func(c *diffCase) {
				// An admin clears the UID of a Released volume's claimRef,
				// and the whole claimRef of another.
				c.patchPV("clear", `{"spec":{"claimRef":{"uid":null}}}`)
				c.patchPV("retain", `{"spec":{"claimRef":null}}`)
			},
			func(c *diffCase) {
				// ... and a new claim of that name takes it again.
				c.createClaim(c.claim("clear").Selector(map[string]string{"none": "none"}))
			},
		}},
		{name: "bound-edits", pvs: func(c *diffCase) {
			for _, id := range []string{"lost", "unref", "nouid"} {
				c.createPV(c.pv(id).Label("pair", id))
			}
			c.createPV(c.pv("recycle").ReclaimPolicy(corev1.PersistentVolumeReclaimRecycle).Label("pair", "recycle"))
			c.createPV(c.pv("stale").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).
				ClaimRef(c.e.ns, "stale", "00000000-0000-0000-0000-000000000002"))
		}, steps: []func(c *diffCase){
			func(c *diffCase) {
				for _, n := range []string{"lost", "unref", "nouid", "recycle"} {
					c.createClaim(c.claim(n).Selector(map[string]string{"pair": n}))
				}
				// Pre-bound to a volume that names a claim of that name
				// with another UID.
				c.createClaim(c.claim("stale").VolumeName(c.pvName("stale")))
			},
			func(c *diffCase) {
				c.e.removePV(c.t.Context(), c.pvName("lost"))
				c.patchPV("unref", `{"spec":{"claimRef":null}}`)
				c.patchPV("nouid", `{"spec":{"claimRef":{"uid":null}}}`)
				c.e.deleteClaim("recycle")
			},
			func(c *diffCase) {
				// The deleted volume of the Lost claim comes back.
				c.createPV(c.pv("lost").Label("pair", "lost"))
				// An admin clears the claimRef of the Failed volume.
				c.patchPV("recycle", `{"spec":{"claimRef":null}}`)
			},
		}, differ: append(noUIDDiffers(1), noUIDDiffers(2)...)},
		{name: "missing-class", pvs: func(c *diffCase) {
			c.createPV(c.pv("fits").Class(c.e.name("missing")))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("fits").Class(c.e.name("missing")))
			c.createClaim(c.claim("nofit").Class(c.e.name("missing")).Size("5Gi"))
		}}},
		{name: "claim-elsewhere", pvs: func(c *diffCase) {
			c.createPV(c.pv("chosen"))
		}, steps: []func(c *diffCase){
			func(c *diffCase) {
				c.createClaim(c.claim("user").VolumeName(c.pvName("chosen")))
			},
			func(c *diffCase) {
				// Volumes that name, with its UID, a claim bound to
				// another volume: one pre-bound by a user, one this
				// driver provisioned (it lost a race).
				uid := string(c.claimUIDs["user"])
				c.createPV(c.pv("user-pre").ClaimRef(c.e.ns, "user", uid))
				c.createPV(c.pv("provisioned").Annotation(annProvisionedBy, c.e.driver).ClaimRef(c.e.ns, "user", uid))
			},
		}},
		{name: "edge", pvs: func(c *diffCase) {
			c.createPV(c.pv("other-pre").Class(c.other).ClaimRef(c.e.ns, "other-pre", ""))
			c.createPV(c.pv("small-pre").ClaimRef(c.e.ns, "small-pre", ""))
			c.createPV(c.pv("wffc-named").Class(c.wffc))
			c.createPV(c.pv("doomed").Label("doomed", "yes").Finalizers("binderdiff.csi.example/hold"))
			if err := c.e.c.CoreV1().PersistentVolumes().Delete(c.t.Context(), c.pvName("doomed"), metav1.DeleteOptions{}); err != nil {
				c.t.Fatal(err)
			}
		}, steps: []func(c *diffCase){func(c *diffCase) {
			// Pre-bound by claimRef to a volume of another class, and to
			// one too small; pre-bound by spec.volumeName to a delayed
			// binding volume, and to one being deleted; selecting only a
			// volume being deleted.
			c.createClaim(c.claim("other-pre").Class(c.wffc))
			c.createClaim(c.claim("small-pre").Size("2Gi"))
			c.createClaim(c.claim("wffc-named").Class(c.wffc).VolumeName(c.pvName("wffc-named")))
			c.createClaim(c.claim("doomed-named").VolumeName(c.pvName("doomed")))
			c.createClaim(c.claim("doomed-sel").Class(c.wffc).Selector(map[string]string{"doomed": "yes"}))
		}}},
		{name: "claimref-moved", pvs: func(c *diffCase) {
			c.createPV(c.pv("uid").Label("pair", "uid"))
			c.createPV(c.pv("name").Label("pair", "name"))
		}, steps: []func(c *diffCase){
			func(c *diffCase) {
				c.createClaim(c.claim("uid").Selector(map[string]string{"pair": "uid"}))
				c.createClaim(c.claim("name").Selector(map[string]string{"pair": "name"}))
				c.createClaim(c.claim("to-uid").Class(c.wffc))
				c.createClaim(c.claim("to-name").Class(c.wffc))
			},
			func(c *diffCase) {
				// An admin moves the claimRef of a Bound volume to another
				// pending claim, with its UID and by name only.
				c.patchPV("uid", `{"spec":{"claimRef":{"name":"to-uid","uid":"`+string(c.claimUIDs["to-uid"])+`"}}}`)
				c.patchPV("name", `{"spec":{"claimRef":{"name":"to-name","uid":null}}}`)
			},
		}, differ: movedByNameDiffers()},
		{name: "foreign-class", pvs: func(c *diffCase) {
			foreign := c.e.createClass(testutil.NewSC(c.e.name("foreign"), "other."+c.e.driver)).Name
			c.createPV(c.pv("ours").Class(foreign))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			// A volume of this driver in the class of another provisioner.
			c.createClaim(c.claim("foreign").Class(c.e.name("foreign")))
		}}},
		{name: "foreign-volume", pvs: func(c *diffCase) {
			// Static volumes of no CSI driver: one in the claims' class,
			// one without class pre-bound by claimRef. Both binders on:
			// kube-controller-manager's binds them, and this driver
			// provisions nothing for these claims (alone, our binder
			// leaves them Pending with a Normal ExternalBinding event;
			// TestSyncPendingClaim).
			c.createPV(c.pv("nfs").NotCSI())
			c.createPV(c.pv("reserved").NotCSI().Class("").ClaimRef(c.e.ns, "reserved", ""))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("data"))
			c.createClaim(c.claim("reserved"))
		}}, coexistOnly: true},
		{name: "race", pvs: func(c *diffCase) {
			c.createPV(c.pv("one"))
		}, steps: []func(c *diffCase){func(c *diffCase) {
			c.createClaim(c.claim("r1"))
			c.createClaim(c.claim("r2"))
		}}, normalize: func(s diffState) {
			// Either claim may win: name them by outcome.
			r1, r2 := s["claim/r1"], s["claim/r2"]
			if strings.Contains(r2, "phase=Bound") {
				r1, r2 = r2, r1
				s["pv/one"] = strings.Replace(s["pv/one"], "claimRef=r2", "claimRef=r1", 1)
			}
			delete(s, "claim/r1")
			delete(s, "claim/r2")
			s["claim/winner"], s["claim/loser"] = r1, r2
		}},
	}
}

// wantMissingDiffers is the documented difference of a claim whose
// spec.volumeName names no volume: our binder says so.
func wantMissingDiffers(step int) diffExpected {
	return diffExpected{
		step: step, key: "claim/want-missing",
		ours: "phase=Pending volume=?missing capacity=0 modes=[] bindCompleted=false boundByController=false provisioner=false events=[Warning FailedBinding]",
		kcm:  "phase=Pending volume=?missing capacity=0 modes=[] bindCompleted=false boundByController=false provisioner=false events=[]",
		why:  "README: a spec.volumeName naming no volume gets a Warning FailedBinding, which upstream does not post",
	}
}

// patchPV merge-patches the scenario's volume id.
func (c *diffCase) patchPV(id, patch string) {
	c.t.Helper()
	_, err := c.e.c.CoreV1().PersistentVolumes().Patch(c.t.Context(), c.pvName(id), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
}

// noUIDDiffers is the documented difference of a Bound volume whose
// claimRef UID an admin removed.
func noUIDDiffers(step int) []diffExpected {
	return []diffExpected{{
		step: step, key: "claim/nouid",
		ours: "phase=Bound volume=nouid capacity=1Gi modes=[ReadWriteOnce] bindCompleted=true boundByController=true provisioner=false events=[]",
		kcm:  "phase=Lost volume=nouid capacity=0 modes=[] bindCompleted=true boundByController=true provisioner=false events=[Warning ClaimMisbound]",
		why:  "README: a bound claim whose volume's claimRef lost its UID (a hand edit) binds it again; upstream marks it Lost",
	}, {
		step: step, key: "pv/nouid",
		ours: "phase=Bound claimRef=nouid(uid) boundByController=true events=[]",
		kcm:  "phase=Available claimRef=nouid(no uid) boundByController=true events=[]",
		why:  "the same hand edit: ours restores the UID, upstream leaves the volume Available",
	}}
}

// movedByNameDiffers is the documented difference of a Bound volume whose
// claimRef an admin moved, by name only, to another claim: the claim still
// bound to it keeps it (Lost, as upstream), the other claim does not get it.
func movedByNameDiffers() []diffExpected {
	const why = "README: a volume whose claimRef was edited away from a claim still bound to it is not bound to another claim (VolumeStillInUse); upstream binds it to the claim named"
	return []diffExpected{{
		step: 1, key: "claim/to-name",
		ours: "phase=Pending volume= capacity=0 modes=[] bindCompleted=false boundByController=false provisioner=false events=[Normal WaitForFirstConsumer]",
		kcm:  "phase=Bound volume=name capacity=1Gi modes=[ReadWriteOnce] bindCompleted=true boundByController=true provisioner=false events=[Normal WaitForFirstConsumer]",
		why:  why,
	}, {
		step: 1, key: "pv/name",
		ours: "phase=Available claimRef=to-name(no uid) boundByController=true events=[Warning VolumeStillInUse]",
		kcm:  "phase=Bound claimRef=to-name(uid) boundByController=true events=[]",
		why:  why,
	}}
}
