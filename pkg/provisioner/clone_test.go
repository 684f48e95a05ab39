package provisioner

import (
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

func cloneCaps() csiclient.Capabilities {
	c := baseCaps()
	c.CloneVolume = true
	return c
}

// cloneOf is a clone of the claim src in class testClass.
func cloneOf(src string) *testutil.PVCBuilder {
	return newClaim("clone").DataSource(nil, kindClaim, src)
}

// sourcePair is a Bound source claim "src" and its Bound volume "pv-src".
func sourcePair() (*testutil.PVCBuilder, *testutil.PVBuilder) {
	src := newClaim("src").VolumeName("pv-src").Phase(corev1.ClaimBound)
	pv := testutil.NewPV("pv-src", testDriver).BoundTo(src.Obj()).Phase(corev1.VolumeBound)
	return src, pv
}

func TestClone(t *testing.T) {
	deleting := func(b *testutil.PVCBuilder) *testutil.PVCBuilder { return b.Deleted().Finalizers(CloneFinalizer) }
	tests := []struct {
		name  string
		caps  csiclient.Capabilities
		clone *corev1.PersistentVolumeClaim
		// edit changes the source claim and volume before the test.
		edit func(src *testutil.PVCBuilder, pv *testutil.PVBuilder)
		// noSource and noVolume leave them out of the API.
		noSource, noVolume bool
		wantState          controller.ProvisioningState
		wantErr            string // "" for success
		wantWrites         []string
	}{
		{
			name:  "clone: source finalizer, in-flight finalizer, CreateVolume with the source's volume",
			clone: cloneOf("src").Obj(), wantState: controller.ProvisioningFinished,
			wantWrites: []string{"update persistentvolumeclaims", "update persistentvolumeclaims"},
		},
		{
			name: "through dataSourceRef only",
			clone: func() *corev1.PersistentVolumeClaim {
				c := cloneOf("src").Obj()
				c.Spec.DataSource = nil
				return c
			}(),
			wantState: controller.ProvisioningFinished, wantWrites: []string{"update persistentvolumeclaims", "update persistentvolumeclaims"},
		},
		{
			name:  "a bigger clone, of another class of the driver; the source already protected",
			clone: cloneOf("src").Size("5Gi").Obj(), wantState: controller.ProvisioningFinished,
			edit:       func(src *testutil.PVCBuilder, _ *testutil.PVBuilder) { src.Class("other").Finalizers(CloneFinalizer) },
			wantWrites: []string{"update persistentvolumeclaims"},
		},
		{
			name: "a driver without CLONE_VOLUME", caps: baseCaps(), clone: cloneOf("src").Obj(),
			wantState: controller.ProvisioningFinished, wantErr: "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported",
		},
		{
			name: "source missing", clone: cloneOf("src").Obj(), noSource: true, wantState: controller.ProvisioningNoChange,
			wantErr: `error getting handle for DataSource Type PersistentVolumeClaim by Name src: error getting PVC src (namespace "ns") from api server`,
		},
		{
			name: "source Pending", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange,
			edit:    func(src *testutil.PVCBuilder, _ *testutil.PVBuilder) { src.Phase(corev1.ClaimPending) },
			wantErr: "the PVC DataSource src must have a status of Bound.  Got Pending",
		},
		{
			name: "source being deleted", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange,
			edit: func(src *testutil.PVCBuilder, _ *testutil.PVBuilder) {
				src.Deleted().Finalizers("kubernetes.io/pvc-protection")
			},
			wantErr: "the PVC DataSource src is currently being deleted",
		},
		{
			name: "source being deleted, protected, but this clone never started", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange,
			edit:    func(src *testutil.PVCBuilder, _ *testutil.PVBuilder) { deleting(src) },
			wantErr: "the PVC DataSource src is currently being deleted",
		},
		{
			name:  "source being deleted, protected, and this clone's CreateVolume started: it goes on",
			clone: cloneOf("src").Finalizers(inflight.Finalizer).Obj(), wantState: controller.ProvisioningFinished,
			edit: func(src *testutil.PVCBuilder, _ *testutil.PVBuilder) { deleting(src) },
		},
		{
			name: "source without class", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange,
			edit:    func(src *testutil.PVCBuilder, _ *testutil.PVBuilder) { src.Obj().Spec.StorageClassName = nil },
			wantErr: "the source PVC (src) storageclass cannot be empty",
		},
		{
			name: "a smaller clone", clone: cloneOf("src").Size("512Mi").Obj(), wantState: controller.ProvisioningNoChange,
			wantErr: "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 536870912 but source is 1073741824",
		},
		{
			name: "source without volumeName", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange,
			edit:    func(src *testutil.PVCBuilder, _ *testutil.PVBuilder) { src.VolumeName("") },
			wantErr: "volume name is empty in source PVC src",
		},
		{name: "source volume missing", clone: cloneOf("src").Obj(), noVolume: true, wantState: controller.ProvisioningNoChange, wantErr: errSourceInvalid.Error()},
		{
			name: "source volume of another driver", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange, wantErr: errSourceInvalid.Error(),
			edit: func(_ *testutil.PVCBuilder, pv *testutil.PVBuilder) { pv.Obj().Spec.CSI.Driver = "other.csi" },
		},
		{
			name: "source volume not CSI", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange, wantErr: errSourceInvalid.Error(),
			edit: func(_ *testutil.PVCBuilder, pv *testutil.PVBuilder) { pv.NotCSI() },
		},
		{
			name: "source volume bound to another claim", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange, wantErr: errSourceInvalid.Error(),
			edit: func(_ *testutil.PVCBuilder, pv *testutil.PVBuilder) { pv.ClaimRef(testNS, "src", "uid-old") },
		},
		{
			name: "source volume Released", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange, wantErr: errSourceInvalid.Error(),
			edit: func(_ *testutil.PVCBuilder, pv *testutil.PVBuilder) { pv.Phase(corev1.VolumeReleased) },
		},
		{
			name: "Block source, Filesystem clone", clone: cloneOf("src").Obj(), wantState: controller.ProvisioningNoChange,
			edit:    func(src *testutil.PVCBuilder, pv *testutil.PVBuilder) { src.Block(); pv.Block() },
			wantErr: "Source is Block, but new PVC requested Filesystem",
		},
		{
			name: "Filesystem source, Block clone", clone: cloneOf("src").Block().Obj(), wantState: controller.ProvisioningNoChange,
			wantErr: "Source is Filesystem, but new PVC requested Block",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, pv := sourcePair()
			if tt.edit != nil {
				tt.edit(src, pv)
			}
			class := newClass().Obj()
			other := testutil.NewSC("other", testDriver).Obj()
			objects := []runtime.Object{tt.clone, class, other}
			if !tt.noSource {
				objects = append(objects, src.Obj())
			}
			if !tt.noVolume {
				objects = append(objects, pv.Obj())
			}
			caps := tt.caps
			if caps.DriverName == "" {
				caps = cloneCaps()
			}
			h := newHarness(t, caps, objects)
			got, state, err := h.provision(tt.clone, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || (tt.wantErr == "") != (err == nil) {
				t.Fatalf("Provision = %v, %q; want %v, %q", state, errString(err), tt.wantState, tt.wantErr)
			}
			creates := h.driver.createCalls()
			if tt.wantErr != "" {
				if got != nil || len(creates) != 0 {
					t.Errorf("a refused clone gave a PV (%v) or %d CreateVolume calls", got != nil, len(creates))
				}
				if w := h.writes(); len(w) != 0 {
					t.Errorf("a refused clone wrote %v", w)
				}
				return
			}
			if len(creates) != 1 || creates[0].GetVolumeContentSource().GetVolume().GetVolumeId() != "handle-pv-src" {
				t.Fatalf("CreateVolume calls %v, want one from volume handle-pv-src", creates)
			}
			if got == nil {
				t.Fatal("no PV")
			}
			if diff := cmp.Diff(tt.wantWrites, h.writes()); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			if live := h.liveClaim(src.Obj()); !slices.Contains(live.Finalizers, CloneFinalizer) {
				t.Errorf("source claim finalizers %v, want %s", live.Finalizers, CloneFinalizer)
			}
		})
	}
}

// TestCloneCheck: the binder's check validates the source without writing.
func TestCloneCheck(t *testing.T) {
	src, pv := sourcePair()
	src.Phase(corev1.ClaimPending)
	clone, class := cloneOf("src").Obj(), newClass().Obj()
	h := newHarness(t, cloneCaps(), objs(clone, class, src.Obj(), pv.Obj()))
	err := h.p.CheckProvision(h.ctx, clone, class)
	if !strings.Contains(errString(err), "must have a status of Bound") {
		t.Errorf("CheckProvision = %v, want the source's phase reported", err)
	}
	if w := h.writes(); len(w) != 0 {
		t.Errorf("CheckProvision wrote %v", w)
	}
}

// TestCloneContentSourceIsTheVolume guards the request field: the content
// source names the source's volume handle, not its PV name.
func TestCloneContentSourceIsTheVolume(t *testing.T) {
	src, pv := sourcePair()
	pv.Obj().Spec.CSI.VolumeHandle = "backend-42"
	clone, class := cloneOf("src").Obj(), newClass().Obj()
	h := newHarness(t, cloneCaps(), objs(clone, class, src.Obj(), pv.Obj()))
	if _, _, err := h.provision(clone, class); err != nil {
		t.Fatal(err)
	}
	want := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "backend-42"}}}
	if got := h.driver.createCalls()[0].GetVolumeContentSource(); got.String() != want.String() {
		t.Errorf("content source %v, want %v", got, want)
	}
}

// TestContentSourceMissing: a driver that answers a clone without the
// content source ignored it. The volume is deleted again and never gets a
// PV, and the error is not final (as upstream), unless the claim is being
// deleted.
func TestContentSourceMissing(t *testing.T) {
	tests := []struct {
		name       string
		deleting   bool
		answer     *csi.Volume
		deleteErrs []error
		wantState  controller.ProvisioningState
		wantErr    string
		wantDelete int
	}{
		{name: "reported: recorded", answer: &csi.Volume{VolumeId: "vol-1", ContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "h-src"}},
		}}, wantState: controller.ProvisioningFinished},
		{
			name: "missing: deleted, not final", answer: &csi.Volume{VolumeId: "vol-1"},
			wantState: controller.ProvisioningInBackground, wantErr: "volume content source missing", wantDelete: 1,
		},
		{
			name: "missing and the cleanup fails", answer: &csi.Volume{VolumeId: "vol-1"},
			deleteErrs: []error{csiErr(codes.Internal), csiErr(codes.Internal), csiErr(codes.Internal), csiErr(codes.Internal), csiErr(codes.Internal)},
			wantState:  controller.ProvisioningInBackground, wantErr: "volume content source missing. Cleanup of volume pvc-uid-clone failed, volume is orphaned", wantDelete: 5,
		},
		{
			name: "missing for a claim being deleted: released", deleting: true, answer: &csi.Volume{VolumeId: "vol-1"},
			wantState: controller.ProvisioningFinished, wantErr: "volume content source missing", wantDelete: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, pv := sourcePair()
			b := cloneOf("src").Finalizers(inflight.Finalizer)
			if tt.deleting {
				b.Deleted()
			}
			clone, class := b.Obj(), newClass().Obj()
			h := newHarness(t, cloneCaps(), objs(clone, class, src.Obj(), pv.Obj()))
			h.driver.createAnswers = []createAnswer{{vol: tt.answer}}
			h.driver.deleteErrs = tt.deleteErrs

			got, state, err := h.provision(clone, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || (tt.wantErr == "") != (err == nil) {
				t.Fatalf("Provision = %v, %q; want %v, %q", state, errString(err), tt.wantState, tt.wantErr)
			}
			if (got != nil) != (tt.wantErr == "") {
				t.Errorf("PV %v, want one only when the source was reported", got)
			}
			if n := len(h.driver.deleteCalls()); n != tt.wantDelete {
				t.Errorf("DeleteVolume calls = %d, want %d", n, tt.wantDelete)
			}
			if has := inflight.Has(h.liveClaim(clone)); has == (tt.deleting && tt.wantDelete > 0) {
				t.Errorf("in-flight finalizer present = %v", has)
			}
		})
	}
}

func TestCloneSourceSync(t *testing.T) {
	protected := func() *testutil.PVCBuilder {
		return newClaim("src").VolumeName("pv-src").Phase(corev1.ClaimBound).Finalizers("kubernetes.io/pvc-protection", CloneFinalizer)
	}
	pendingClone := cloneOf("src").Phase(corev1.ClaimPending).Obj()
	newClone := cloneOf("src").Phase("").Obj() // just created: no phase yet
	boundClone := cloneOf("src").Phase(corev1.ClaimBound).Obj()
	refOnly := cloneOf("src").Phase(corev1.ClaimPending).Obj()
	refOnly.Name, refOnly.Spec.DataSource = "ref-only", nil
	otherNS := cloneOf("src").Phase(corev1.ClaimPending).Obj()
	otherNS.Namespace = "elsewhere"
	otherSource := cloneOf("not-src").Phase(corev1.ClaimPending).Obj()
	tests := []struct {
		name       string
		objects    []runtime.Object
		wantRemove bool
	}{
		{"deleting, a clone pending: kept", objs(protected().Deleted().Obj(), pendingClone), false},
		{"deleting, a clone pending through dataSourceRef only: kept", objs(protected().Deleted().Obj(), refOnly), false},
		{"deleting, a clone without a phase yet: kept", objs(protected().Deleted().Obj(), newClone), false},
		{"deleting, the clone bound: removed", objs(protected().Deleted().Obj(), boundClone), true},
		{"deleting, no clone: removed", objs(protected().Deleted().Obj()), true},
		{"deleting, pending clones of other claims or namespaces only: removed", objs(protected().Deleted().Obj(), otherNS, otherSource), true},
		{"not deleting: kept", objs(protected().Obj()), false},
		{"deleting, without the finalizer: nothing to do", objs(newClaim("src").Deleted().Finalizers("kubernetes.io/pvc-protection").Obj()), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, cloneCaps(), tt.objects)
			if err := h.p.cloneSourceSync(h.ctx, testNS+"/src"); err != nil {
				t.Fatal(err)
			}
			writes := h.writes()
			if !tt.wantRemove {
				if len(writes) != 0 {
					t.Errorf("wrote %v, want nothing", writes)
				}
				return
			}
			live := h.liveClaim(tt.objects[0].(*corev1.PersistentVolumeClaim))
			if len(writes) != 1 || slices.Contains(live.Finalizers, CloneFinalizer) || !slices.Contains(live.Finalizers, "kubernetes.io/pvc-protection") {
				t.Errorf("writes %v, finalizers %v; want one update removing only %s", writes, live.Finalizers, CloneFinalizer)
			}
		})
	}
}

// TestCloneSourceKeptIsLogged: a source claim kept Terminating by its
// cloning protection says why in a log line of the default verbosity,
// naming the source and the pending clone (upstream logs a warning at
// every retry); otherwise nothing explains the Terminating claim.
func TestCloneSourceKeptIsLogged(t *testing.T) {
	src := newClaim("src").VolumeName("pv-src").Phase(corev1.ClaimBound).Finalizers(CloneFinalizer).Deleted().Obj()
	h := newHarness(t, cloneCaps(), objs(src, cloneOf("src").Phase(corev1.ClaimPending).Obj()))
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(0), ktesting.BufferLogs(true)))
	if err := h.p.cloneSourceSync(klog.NewContext(h.ctx, logger), testNS+"/src"); err != nil {
		t.Fatal(err)
	}
	text := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if !strings.Contains(text, `pvc="ns/src"`) || !strings.Contains(text, "clone") {
		t.Errorf("no log line at verbosity 0 explains the kept source; log:\n%s", text)
	}
}
