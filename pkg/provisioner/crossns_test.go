package provisioner

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapfake "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/fake"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
	"github.com/kube-storage/csi-provisioner/pkg/refgrant"
)

// sourceNS is the namespace of the sources in these tests; the claims are in
// testNS.
const sourceNS = "source-ns"

// fakeGrants allows the references it lists, from testNS only.
type fakeGrants struct {
	allowed []refgrant.Reference
	err     error
	asked   []refgrant.Reference
}

var _ ReferenceGrants = (*fakeGrants)(nil)

func (g *fakeGrants) Allows(from string, to refgrant.Reference) (bool, error) {
	g.asked = append(g.asked, to)
	return from == testNS && slices.Contains(g.allowed, to), g.err
}

// fromNamespace points the claim's data source into namespace, through
// dataSourceRef only, as the API server stores it.
func fromNamespace(c *corev1.PersistentVolumeClaim, namespace string) *corev1.PersistentVolumeClaim {
	c.Spec.DataSource = nil
	c.Spec.DataSourceRef.Namespace = ptr.To(namespace)
	return c
}

var sourceClaimRef = refgrant.Reference{Namespace: sourceNS, Kind: kindClaim, Name: "src"}

// newGrantedClone returns a harness with claim "clone" of testNS cloning
// claim "src" of sourceNS, which grants lets it read until the test
// changes grants.allowed, and the clone's class.
func newGrantedClone(t *testing.T) (*harness, *corev1.PersistentVolumeClaim, *storagev1.StorageClass, *fakeGrants) {
	t.Helper()
	src, pv := sourcePair()
	src.Obj().Namespace = sourceNS
	pv.BoundTo(src.Obj())
	clone := fromNamespace(cloneOf("src").Obj(), sourceNS)
	class := newClass().Obj()
	grants := &fakeGrants{allowed: []refgrant.Reference{sourceClaimRef}}
	h := newHarness(t, cloneCaps(), objs(clone, class, src.Obj(), pv.Obj()), WithReferenceGrants(grants))
	return h, clone, class, grants
}

// deleteClaim marks the live copy of claim deleted (its finalizers keep
// it), waits until the provisioner's informer has seen it, and returns it.
func (h *harness) deleteClaim(claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	h.t.Helper()
	deleting := h.liveClaim(claim).DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	if _, err := h.client.CoreV1().PersistentVolumeClaims(deleting.Namespace).Update(h.ctx, deleting, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	testutil.Eventually(h.t, 0, "the informer never saw the deletion of claim "+deleting.Name, func(context.Context) (bool, error) {
		c, err := h.p.claims.PersistentVolumeClaims(deleting.Namespace).Get(deleting.Name)
		return err == nil && c.DeletionTimestamp != nil, nil
	})
	return deleting
}

// referenceGrant is a ReferenceGrant object as the dynamic informer
// delivers it (the handlers read its metadata only).
func referenceGrant(namespace, name, version, resourceVersion string) *unstructured.Unstructured {
	g := &unstructured.Unstructured{}
	g.SetAPIVersion(refgrant.Group + "/" + version)
	g.SetKind("ReferenceGrant")
	g.SetNamespace(namespace)
	g.SetName(name)
	g.SetResourceVersion(resourceVersion)
	return g
}

func TestCrossNamespaceClone(t *testing.T) {
	tests := []struct {
		name string
		// grants nil: the feature is off.
		grants     *fakeGrants
		namespace  string // of the data source; default sourceNS
		wantState  controller.ProvisioningState
		wantErr    string
		wantWrites []string
	}{
		{
			name: "feature off", wantState: controller.ProvisioningFinished,
			wantErr: "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled",
		},
		{
			name: "no grant", grants: &fakeGrants{}, wantState: controller.ProvisioningFinished,
			wantErr: "accessing source-ns/src of PersistentVolumeClaim dataSource from ns/clone isn't allowed",
		},
		{
			name: "grants unreadable", grants: &fakeGrants{allowed: []refgrant.Reference{sourceClaimRef}, err: errors.New("no index")},
			wantState: controller.ProvisioningFinished, wantErr: "no index",
		},
		{
			name: "granted: cloned from the source's volume, the source protected", grants: &fakeGrants{allowed: []refgrant.Reference{sourceClaimRef}},
			wantState: controller.ProvisioningFinished, wantWrites: []string{"update persistentvolumeclaims", "update persistentvolumeclaims"},
		},
		{
			name: "its own namespace named: no grant needed, feature off", namespace: testNS,
			wantState: controller.ProvisioningFinished, wantWrites: []string{"update persistentvolumeclaims", "update persistentvolumeclaims"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := tt.namespace
			if ns == "" {
				ns = sourceNS
			}
			src, pv := sourcePair()
			src.Obj().Namespace = ns
			pv.BoundTo(src.Obj())
			clone := fromNamespace(cloneOf("src").Obj(), ns)
			class := newClass().Obj()
			var opts []Option
			if tt.grants != nil {
				opts = append(opts, WithReferenceGrants(tt.grants))
			}
			h := newHarness(t, cloneCaps(), objs(clone, class, src.Obj(), pv.Obj()), opts...)
			got, state, err := h.provision(clone, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || (tt.wantErr == "") != (err == nil) {
				t.Fatalf("Provision = %v, %q; want %v, %q", state, errString(err), tt.wantState, tt.wantErr)
			}
			if tt.wantErr != "" {
				if got != nil || len(h.driver.createCalls()) != 0 || len(h.writes()) != 0 {
					t.Errorf("a refused clone gave a PV (%v), %d CreateVolume calls, writes %v", got != nil, len(h.driver.createCalls()), h.writes())
				}
				if err := h.p.CheckProvision(h.ctx, clone, class); !strings.Contains(errString(err), tt.wantErr) {
					t.Errorf("CheckProvision = %v, want %q", err, tt.wantErr)
				}
				return
			}
			creates := h.driver.createCalls()
			if len(creates) != 1 || creates[0].GetVolumeContentSource().GetVolume().GetVolumeId() != "handle-pv-src" {
				t.Fatalf("CreateVolume calls %v, want one from volume handle-pv-src", creates)
			}
			if w := h.writes(); !slices.Equal(w, tt.wantWrites) {
				t.Errorf("writes %v, want %v", w, tt.wantWrites)
			}
			if live := h.liveClaim(src.Obj()); !slices.Contains(live.Finalizers, CloneFinalizer) {
				t.Errorf("source %s/src finalizers %v, want %s", ns, live.Finalizers, CloneFinalizer)
			}
		})
	}
}

// TestCrossNamespaceCloneProtection: a pending clone in another namespace
// keeps its source's cloning protection under the feature while a grant
// allows it or its CreateVolume may have started (this process sent one;
// the in-flight finalizer alone is no proof, the claim's user may add it);
// a claim that may not read the source does not (it would keep
// a claim of another namespace from being deleted for ever). Without the
// feature such a clone is never provisioned and does not count.
func TestCrossNamespaceCloneProtection(t *testing.T) {
	deletingSource := func() *corev1.PersistentVolumeClaim {
		c := newClaim("src").VolumeName("pv-src").Phase(corev1.ClaimBound).Deleted().Finalizers(CloneFinalizer).Obj()
		c.Namespace = sourceNS
		return c
	}
	pending := fromNamespace(cloneOf("src").Phase(corev1.ClaimPending).Obj(), sourceNS)
	started := fromNamespace(cloneOf("src").Phase(corev1.ClaimPending).Finalizers(inflight.Finalizer).Obj(), sourceNS)
	bound := fromNamespace(cloneOf("src").Phase(corev1.ClaimBound).Obj(), sourceNS)
	granted := []refgrant.Reference{sourceClaimRef}
	tests := []struct {
		name       string
		grants     bool
		allowed    []refgrant.Reference
		clone      *corev1.PersistentVolumeClaim
		sent       bool // this process sent a CreateVolume for the clone
		wantRemove bool
	}{
		{name: "feature on, a granted clone pending in another namespace: kept", grants: true, allowed: granted, clone: pending},
		{name: "feature on, that clone without a grant: removed", grants: true, clone: pending, wantRemove: true},
		{name: "feature on, a clone without a grant whose create may have started: kept", grants: true, clone: started, sent: true},
		{name: "feature on, a clone without a grant with a finalizer its user added: removed", grants: true, clone: started, wantRemove: true},
		{name: "feature on, the granted clone bound: removed", grants: true, allowed: granted, clone: bound, wantRemove: true},
		{name: "feature off: that clone does not count", clone: pending, wantRemove: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []Option
			if tt.grants {
				opts = append(opts, WithReferenceGrants(&fakeGrants{allowed: tt.allowed}))
			}
			src := deletingSource()
			h := newHarness(t, cloneCaps(), objs(src, tt.clone), opts...)
			if tt.sent {
				h.p.attempts.begin(tt.clone.UID)
			}
			if err := h.p.cloneSourceSync(h.ctx, sourceNS+"/src"); err != nil {
				t.Fatal(err)
			}
			removed := !slices.Contains(h.liveClaim(src).Finalizers, CloneFinalizer)
			if removed != tt.wantRemove {
				t.Errorf("cloning protection removed: %v, want %v (writes %v)", removed, tt.wantRemove, h.writes())
			}
		})
	}
}

// TestCrossNamespaceRestore: a granted restore from a snapshot of another
// namespace uses its handle and protects that snapshot for the time of the
// CreateVolume; the sweep keeps the protection while such a restore is
// pending.
func TestCrossNamespaceRestore(t *testing.T) {
	snap, content := readySnapshot()
	snap.Namespace = sourceNS
	content.Spec.VolumeSnapshotRef.Namespace = sourceNS
	snaps := snapfake.NewSimpleClientset(snap, content) //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
	claim := fromNamespace(restoreOf("snap"), sourceNS)
	class := newClass().Obj()
	ref := refgrant.Reference{Namespace: sourceNS, Group: snapshotAPIGroup, Kind: kindVolumeSnapshot, Name: "snap"}
	h := newHarness(t, snapshotCaps(), objs(claim, class), WithSnapshotClient(snaps), WithReferenceGrants(&fakeGrants{allowed: []refgrant.Reference{ref}}))
	if _, _, err := h.provision(claim, class); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	creates := h.driver.createCalls()
	if len(creates) != 1 || creates[0].GetVolumeContentSource().GetSnapshot().GetSnapshotId() != "snap-handle" {
		t.Fatalf("CreateVolume calls %v, want one from snapshot snap-handle", creates)
	}
	var updated []string
	for _, a := range snaps.Actions() {
		if a.GetVerb() == "update" && a.GetResource().Resource == "volumesnapshots" {
			updated = append(updated, a.GetNamespace())
		}
	}
	if !slices.Equal(updated, []string{sourceNS, sourceNS}) {
		t.Errorf("snapshot updates in namespaces %v, want the protection added and removed in %s", updated, sourceNS)
	}
}

// TestCrossNamespaceSweep: the sweep keeps the source protection of a
// snapshot of another namespace while a pending restore may read it (a
// grant) or may have started its CreateVolume (the in-flight finalizer);
// an ungranted claim, or one without the feature, does not keep it.
func TestCrossNamespaceSweep(t *testing.T) {
	protected := func(ns, name string) *snapv1.VolumeSnapshot {
		return &snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{SnapshotFinalizer}}}
	}
	pending := fromNamespace(restoreOf("a"), sourceNS)
	pending.Status.Phase = corev1.ClaimPending
	started := pending.DeepCopy()
	started.Finalizers = []string{inflight.Finalizer}
	snapRef := refgrant.Reference{Namespace: sourceNS, Group: snapshotAPIGroup, Kind: kindVolumeSnapshot, Name: "a"}
	for _, tt := range []struct {
		name     string
		grants   bool
		allowed  []refgrant.Reference
		claim    *corev1.PersistentVolumeClaim
		sent     bool // this process sent a CreateVolume for the claim
		wantKept bool
	}{
		{name: "granted", grants: true, allowed: []refgrant.Reference{snapRef}, claim: pending, wantKept: true},
		{name: "no grant", grants: true, claim: pending},
		{name: "no grant, create may have started", grants: true, claim: started, sent: true, wantKept: true},
		{name: "no grant, a finalizer the claim's user added", grants: true, claim: started},
		{name: "feature off", claim: pending},
	} {
		t.Run(tt.name, func(t *testing.T) {
			snaps := snapfake.NewSimpleClientset(protected(sourceNS, "a"), protected(testNS, "a")) //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
			opts := []Option{WithSnapshotClient(snaps)}
			if tt.grants {
				opts = append(opts, WithReferenceGrants(&fakeGrants{allowed: tt.allowed}))
			}
			h := newHarness(t, snapshotCaps(), objs(tt.claim), opts...)
			if tt.sent {
				h.p.attempts.begin(tt.claim.UID)
			}
			if err := h.p.sweepSnapshots(h.ctx); err != nil {
				t.Fatal(err)
			}
			for ns, wantKept := range map[string]bool{sourceNS: tt.wantKept, testNS: false} {
				got, err := snaps.SnapshotV1().VolumeSnapshots(ns).Get(t.Context(), "a", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if kept := slices.Contains(got.Finalizers, SnapshotFinalizer); kept != wantKept {
					t.Errorf("snapshot %s/a kept its protection: %v, want %v", ns, kept, wantKept)
				}
			}
		})
	}
}

// TestCrossNamespacePopulator: a populator's source in another namespace
// needs a grant like any other before the claim is left to the populator.
func TestCrossNamespacePopulator(t *testing.T) {
	group := "populators.example.com"
	claim := fromNamespace(newClaim("c").DataSource(&group, "Sample", "s1").Obj(), sourceNS)
	class := newClass().Obj()
	ref := refgrant.Reference{Namespace: sourceNS, Group: group, Kind: "Sample", Name: "s1"}
	for _, tt := range []struct {
		allowed     []refgrant.Reference
		wantIgnored bool
	}{{nil, false}, {[]refgrant.Reference{ref}, true}} {
		h := newHarness(t, baseCaps(), objs(claim, class), WithReferenceGrants(&fakeGrants{allowed: tt.allowed}))
		_, _, err := h.provision(claim, class)
		if isIgnored(err) != tt.wantIgnored || err == nil {
			t.Errorf("granted %v: Provision error %v, want ignored: %v", tt.allowed != nil, err, tt.wantIgnored)
		}
	}
}

// TestReferenceGrantNarrowedRechecksSources: a ReferenceGrant deleted or
// changed may no longer let a pending clone keep its source: the cloning
// protection re-checks the sources being deleted, with the cloning
// protection finalizer, in the grant's namespace, and no other claim.
// Before, such a source stayed Terminating until the informer's resync
// (an hour).
func TestReferenceGrantNarrowedRechecksSources(t *testing.T) {
	src := newClaim("src").VolumeName("pv-src").Phase(corev1.ClaimBound).Deleted().Finalizers("kubernetes.io/pvc-protection", CloneFinalizer).Obj()
	src.Namespace = sourceNS
	live := newClaim("live").Finalizers(CloneFinalizer).Obj() // not being deleted
	live.Namespace = sourceNS
	elsewhere := newClaim("elsewhere").Deleted().Finalizers(CloneFinalizer).Obj() // another namespace
	h := newHarness(t, cloneCaps(), objs(src, live, elsewhere), WithReferenceGrants(&fakeGrants{}))
	grant := func(rv string) *unstructured.Unstructured { return referenceGrant(sourceNS, "allow-ns", "v1beta1", rv) }
	handler := h.p.ReferenceGrantHandler()
	handler.OnDelete(grant("7")) // the cloning protection does not run: nothing to queue
	var rechecked []string
	recheck := func(key string) { rechecked = append(rechecked, key) }
	h.p.recheckSource.Store(&recheck)
	handler.OnDelete(grant("7"))
	handler.OnDelete(cache.DeletedFinalStateUnknown{Key: sourceNS + "/allow-ns", Obj: grant("7")})
	handler.OnUpdate(grant("7"), grant("8"))
	handler.OnUpdate(grant("8"), grant("8")) // a resync
	want := []string{sourceNS + "/src", sourceNS + "/src", sourceNS + "/src"}
	if !slices.Equal(rechecked, want) {
		t.Errorf("re-checked %q, want %q", rechecked, want)
	}
}

// TestCrossNamespaceCloneDeletedAfterGrantRevoked: a cross-namespace
// clone's CreateVolume times out (the driver goes on copying), its
// ReferenceGrant is deleted, then the clone. The provisioner must still
// ask the driver again: only that answer lets the volume go (its PV is
// Released and deleted at once). Before, every retry failed on the grant,
// and the clone stayed Terminating with its volume in the driver for ever.
func TestCrossNamespaceCloneDeletedAfterGrantRevoked(t *testing.T) {
	h, clone, class, grants := newGrantedClone(t)
	h.driver.createAnswers = []createAnswer{{err: csiErr(codes.DeadlineExceeded)}, {vol: &csi.Volume{VolumeId: "id-clone", CapacityBytes: 1 << 30,
		ContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "handle-pv-src"}}}}}}
	if _, state, err := h.provision(clone, class); state != controller.ProvisioningInBackground {
		t.Fatalf("first Provision = %v, %v; want the timeout, in background", state, err)
	}

	grants.allowed = nil // the ReferenceGrant is deleted
	deleting := h.deleteClaim(clone)
	pvOut, state, err := h.provision(deleting, class)
	if err != nil || pvOut == nil {
		t.Fatalf("Provision of the deleted clone = %v, %v, %v; want its volume's PV, so that it is released and deleted", pvOut, state, err)
	}
	if n := len(h.driver.createCalls()); n != 2 {
		t.Errorf("%d CreateVolume calls, want 2 (the timed-out one and its repetition)", n)
	}
}

// TestUngrantedCloneWithUserFinalizerDeleted: a user who may not read a
// claim of another namespace (no ReferenceGrant) creates a claim cloning
// it with the in-flight finalizer already in its metadata (anybody who may
// create a claim may set its finalizers), then deletes it. This process
// never sent a CreateVolume for it. The grant check must still apply: no
// CreateVolume may copy the other namespace's volume.
func TestUngrantedCloneWithUserFinalizerDeleted(t *testing.T) {
	src, pv := sourcePair()
	src.Obj().Namespace = sourceNS
	pv.BoundTo(src.Obj())
	clone := fromNamespace(cloneOf("src").Finalizers(inflight.Finalizer).Deleted().Obj(), sourceNS)
	class := newClass().Obj()
	h := newHarness(t, cloneCaps(), objs(clone, class, src.Obj(), pv.Obj()), WithReferenceGrants(&fakeGrants{}))
	out, state, err := h.provision(clone, class)
	for _, req := range h.driver.createCalls() {
		t.Errorf("CreateVolume %s sent from volume %q of namespace %s, which no ReferenceGrant lets namespace %s read (Provision = %v, %v, %v)",
			req.GetName(), req.GetVolumeContentSource().GetVolume().GetVolumeId(), sourceNS, testNS, out != nil, state, err)
	}
}
