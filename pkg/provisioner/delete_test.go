package provisioner

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/inflight"
)

func attachment(name, pv, node string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: testDriver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
}

// provisionedPV is a Released PV of the test driver as the library saves
// it, with the deletion-secret annotations.
func provisionedPV(secretName, secretNS string) *testutil.PVBuilder {
	return testutil.NewPV("pv1", testDriver).Class(testClass).ClaimRef(testNS, "c", "uid-c").Phase(corev1.VolumeReleased).
		Annotation(storagehelpers.AnnDynamicallyProvisioned, testDriver).
		Annotation(annDeletionSecretName, secretName).Annotation(annDeletionSecretNS, secretNS)
}

// releasedTwin is a Released PV of the test driver that records pv1's
// volume handle, with reclaim policy policy.
func releasedTwin(policy corev1.PersistentVolumeReclaimPolicy) *corev1.PersistentVolume {
	pv := pvWithHandle("pv-twin", testDriver, "handle-pv1")
	pv.Status.Phase = corev1.VolumeReleased
	pv.Spec.PersistentVolumeReclaimPolicy = policy
	return pv
}

// TestDelete covers Delete: other drivers ignored, deletion secrets from the
// PV annotations or the class, the VolumeAttachment guard, static volumes
// and DeleteVolume errors.
func TestDelete(t *testing.T) {
	withPublish := func(c *csiclient.Capabilities) { c.PublishUnpublish = true }
	tests := []struct {
		name        string
		pv          *corev1.PersistentVolume
		objs        []runtime.Object
		caps        func(*csiclient.Capabilities)
		deleteErr   error
		wantIgnored bool
		wantErr     string
		wantSecrets map[string]string
		wantCall    bool
		wantGets    int // secret GETs
		wantEvent   string
	}{
		{name: "volume of another driver", pv: testutil.NewPV("pv1", "other.example.com").Obj(), wantIgnored: true},
		{name: "not a CSI volume", pv: testutil.NewPV("pv1", testDriver).NotCSI().Obj(), wantIgnored: true},
		{
			// Nobody else deletes it either: the other driver's provisioner
			// skips a volume whose provisioned-by names this driver.
			name: "volume of another driver annotated as provisioned by this one: ignored with a Warning", wantIgnored: true,
			pv: testutil.NewPV("pv1", "other.example.com").Phase(corev1.VolumeReleased).Annotation(storagehelpers.AnnDynamicallyProvisioned, testDriver).Obj(),
			wantEvent: "Warning VolumeFailedDelete persistentvolume pv1 is a CSI volume of driver other.example.com, but pv.kubernetes.io/provisioned-by names " + testDriver +
				": not deleting it; delete the volume with its own driver and this PersistentVolume by hand",
		},
		{
			name: "secret from the annotations", pv: provisionedPV("s", "secretns").Obj(),
			objs: objs(secret("secretns", "s", map[string]string{"token": "t"})), wantSecrets: map[string]string{"token": "t"}, wantCall: true, wantGets: 1,
		},
		{name: "empty annotations: no secret", pv: provisionedPV("", "").Obj(), wantCall: true},
		{name: "annotated secret missing: deleted without it", pv: provisionedPV("gone", "secretns").Obj(), wantCall: true, wantGets: 1},
		{
			name: "annotated secret missing, DeleteVolume fails: the error says so", pv: provisionedPV("gone", "secretns").Obj(),
			deleteErr: csiErr(codes.Unauthenticated), wantCall: true, wantGets: 1,
			wantErr: `mock Unauthenticated (sent without secrets: the deletion secret could not be read: error getting secret gone in namespace secretns: secrets "gone" not found)`,
		},
		{
			// CSI requires OK for a volume that does not exist, but a
			// driver may answer NotFound for one it cannot find for now.
			name: "driver answers NotFound: an error saying how to let the PV go", pv: provisionedPV("", "").Obj(),
			deleteErr: csiErr(codes.NotFound), wantCall: true,
			wantErr: "mock NotFound; CSI requires DeleteVolume to answer OK for a volume that does not exist, so NotFound is not taken as deleted (the volume may still exist). " +
				"If the volume is gone, set the persistentvolume's persistentVolumeReclaimPolicy to Retain and delete it",
		},
		{
			name: "no annotations: secret resolved from the class with the claimRef",
			pv: func() *corev1.PersistentVolume {
				pv := provisionedPV("", "").Obj()
				pv.Annotations = map[string]string{storagehelpers.AnnDynamicallyProvisioned: testDriver}
				return pv
			}(),
			objs: objs(
				newClass().Param(provisionerSecret.nameKey, "${pvc.name}-${pv.name}").Param(provisionerSecret.namespaceKey, "${pvc.namespace}").Obj(),
				secret(testNS, "c-pv1", map[string]string{"k": "from-class"})),
			wantSecrets: map[string]string{"k": "from-class"}, wantCall: true, wantGets: 1,
		},
		{
			name:    "no annotations: annotation tokens cannot resolve",
			pv:      testutil.NewPV("pv1", testDriver).Class(testClass).ClaimRef(testNS, "c", "uid-c").Obj(),
			objs:    objs(newClass().Param(provisionerSecret.nameKey, "${pvc.annotations['x']}").Param(provisionerSecret.namespaceKey, "ns").Obj()),
			wantErr: `failed to get secretreference for volume pv1: error resolving value "${pvc.annotations['x']}"`,
		},
		{
			name: "no annotations, class gone: deleted without secrets",
			pv:   testutil.NewPV("pv1", testDriver).Class(testClass).ClaimRef(testNS, "c", "uid-c").Obj(), wantCall: true,
		},
		{
			name: "no annotations, class gone, DeleteVolume fails: the error says so",
			pv:   testutil.NewPV("pv1", testDriver).Class(testClass).ClaimRef(testNS, "c", "uid-c").Obj(), wantCall: true,
			deleteErr: csiErr(codes.Unauthenticated),
			wantErr:   `mock Unauthenticated (sent without secrets: the storage class that names the deletion secret could not be read: storageclass.storage.k8s.io "` + testClass + `" not found)`,
		},
		{
			name: "no annotations, no claimRef: deleted without secrets",
			pv:   testutil.NewPV("pv1", testDriver).Class(testClass).Obj(),
			objs: objs(newClass().Param(provisionerSecret.nameKey, "s").Param(provisionerSecret.namespaceKey, "ns").Obj()), wantCall: true,
		},
		{
			name: "static volume of this driver", pv: testutil.NewPV("static", testDriver).Phase(corev1.VolumeReleased).Obj(), wantCall: true,
		},
		{
			name: "attached: blocked", pv: provisionedPV("", "").Obj(), caps: withPublish,
			objs:    objs(attachment("va-b", "pv1", "node-b"), attachment("va-a", "pv1", "node-a"), attachment("va-other", "pv2", "node-c")),
			wantErr: "persistentvolume pv1 is still attached to node node-a",
		},
		{
			name: "attachments of other volumes only", pv: provisionedPV("", "").Obj(), caps: withPublish,
			objs: objs(attachment("va-other", "pv2", "node-c")), wantCall: true,
		},
		{
			name: "attachment ignored without PUBLISH_UNPUBLISH", pv: provisionedPV("", "").Obj(),
			objs: objs(attachment("va-a", "pv1", "node-a")), wantCall: true,
		},
		{
			// A driver that gave two claims one volume, or two static PVs
			// of one volume: deleting it would delete the other's data.
			name: "another PV of the driver records the same volume: not deleted", pv: provisionedPV("", "").Obj(),
			objs:    objs(pvWithHandle("pv-twin", testDriver, "handle-pv1")),
			wantErr: "not deleting volume \"handle-pv1\" of persistentvolume pv1: persistentvolume pv-twin of driver " + testDriver + " records the same volume",
		},
		{
			// Static PVs of one share, both Released with Delete: each
			// waiting for the other would keep both for ever.
			name: "the other PV of the volume is Released with Delete too: deleted", pv: provisionedPV("", "").Obj(),
			objs: objs(releasedTwin(corev1.PersistentVolumeReclaimDelete)), wantCall: true,
		},
		{
			name: "the other PV of the volume is Released with Retain: not deleted", pv: provisionedPV("", "").Obj(),
			objs:    objs(releasedTwin(corev1.PersistentVolumeReclaimRetain)),
			wantErr: "persistentvolume pv-twin of driver " + testDriver + " records the same volume",
		},
		{
			name: "the other PV of the volume is Released with Delete but attached: not deleted", pv: provisionedPV("", "").Obj(), caps: withPublish,
			objs:    objs(releasedTwin(corev1.PersistentVolumeReclaimDelete), attachment("va-twin", "pv-twin", "node-a")),
			wantErr: "persistentvolume pv-twin of driver " + testDriver + " records the same volume",
		},
		{
			name: "a PV of another driver has the same handle", pv: provisionedPV("", "").Obj(),
			objs: objs(pvWithHandle("pv-twin", "other.example.com", "handle-pv1")), wantCall: true,
		},
		{
			name: "DeleteVolume final error", pv: provisionedPV("", "").Obj(), deleteErr: csiErr(codes.FailedPrecondition),
			wantErr: "mock FailedPrecondition", wantCall: true,
		},
		{
			name: "DeleteVolume timeout", pv: provisionedPV("", "").Obj(), deleteErr: csiErr(codes.DeadlineExceeded),
			wantErr: "mock DeadlineExceeded", wantCall: true,
		},
		{
			name: "driver cannot delete", pv: provisionedPV("", "").Obj(),
			caps:    func(c *csiclient.Capabilities) { c.CreateDeleteVolume = false },
			wantErr: "controller CREATE_DELETE_VOLUME capability is not reported",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caps := baseCaps()
			if tt.caps != nil {
				tt.caps(&caps)
			}
			h := newHarness(t, caps, append(tt.objs, tt.pv))
			if tt.deleteErr != nil {
				h.driver.deleteErrs = []error{tt.deleteErr}
			}
			err := h.p.Delete(h.ctx, tt.pv)
			if isIgnored(err) != tt.wantIgnored {
				t.Fatalf("Delete = %v, want ignored %v", err, tt.wantIgnored)
			}
			if !tt.wantIgnored && ((tt.wantErr == "") != (err == nil) || !strings.Contains(errString(err), tt.wantErr)) {
				t.Fatalf("Delete = %v, want %q", err, tt.wantErr)
			}
			calls := h.driver.deleteCalls()
			if (len(calls) == 1) != tt.wantCall || len(calls) > 1 {
				t.Fatalf("DeleteVolume calls = %d, want call %v", len(calls), tt.wantCall)
			}
			if tt.wantCall {
				if calls[0].GetVolumeId() != tt.pv.Spec.CSI.VolumeHandle {
					t.Errorf("volume ID = %q, want %q", calls[0].GetVolumeId(), tt.pv.Spec.CSI.VolumeHandle)
				}
				if !maps.Equal(calls[0].GetSecrets(), tt.wantSecrets) {
					t.Errorf("secrets = %v, want %v", calls[0].GetSecrets(), tt.wantSecrets)
				}
			}
			if tt.deleteErr != nil {
				if st, _ := status.FromError(err); st.Code() != csiclient.Code(tt.deleteErr) {
					t.Errorf("returned error lost its gRPC code: %v", err)
				}
			}
			gets := 0
			for _, a := range h.client.Actions() {
				if a.GetVerb() == "get" && a.GetResource().Resource == "secrets" {
					gets++
				}
			}
			if gets != tt.wantGets {
				t.Errorf("secret GETs = %d, want %d", gets, tt.wantGets)
			}
			var want []string
			if tt.wantEvent != "" {
				want = []string{tt.wantEvent}
			}
			if got := h.events(); !slices.Equal(got, want) {
				t.Errorf("events %q, want %q", got, want)
			}
		})
	}
}

// TestShouldDelete: a Released volume with reclaim policy Delete waits for
// its detach without reaching Delete (one Normal event); every other
// volume is left to the library's checks.
func TestShouldDelete(t *testing.T) {
	publish := baseCaps()
	publish.PublishUnpublish = true
	attached := objs(attachment("va-b", "pv1", "node-b"), attachment("va-a", "pv1", "node-a"))
	tests := []struct {
		name      string
		caps      csiclient.Capabilities
		pv        *corev1.PersistentVolume
		objs      []runtime.Object
		want      bool
		wantEvent string
	}{
		{
			name: "Released, attached: waits", caps: publish, pv: provisionedPV("", "").Obj(), objs: attached,
			wantEvent: "Normal VolumeDelete persistentvolume pv1 is still attached to node node-a: it is deleted once detached",
		},
		{name: "Released, detached", caps: publish, pv: provisionedPV("", "").Obj(), objs: objs(attachment("va-other", "pv2", "node-c")), want: true},
		{name: "Bound, attached", caps: publish, pv: provisionedPV("", "").Phase(corev1.VolumeBound).Obj(), objs: attached, want: true},
		{name: "Released, Retain, attached", caps: publish, pv: provisionedPV("", "").ReclaimPolicy(corev1.PersistentVolumeReclaimRetain).Obj(), objs: attached, want: true},
		{name: "driver does not publish", caps: baseCaps(), pv: provisionedPV("", "").Obj(), objs: attached, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.caps, append(tt.objs, tt.pv))
			if got := h.p.ShouldDelete(h.ctx, tt.pv); got != tt.want {
				t.Errorf("ShouldDelete = %v, want %v", got, tt.want)
			}
			var want []string
			if tt.wantEvent != "" {
				want = []string{tt.wantEvent}
			}
			if got := h.events(); !slices.Equal(got, want) {
				t.Errorf("events %q, want %q", got, want)
			}
		})
	}
}

// TestDeleteBeforeAttachmentsKnown: until the VolumeAttachment cache has
// synced, no volume is deleted (it could still be attached).
func TestDeleteBeforeAttachmentsKnown(t *testing.T) {
	caps := baseCaps()
	caps.PublishUnpublish = true
	pv := provisionedPV("", "").Obj()
	client := fake.NewClientset(pv)
	driver := &fakeDriver{caps: caps}
	// The factory is never started: no cache has synced.
	p, err := New(client, driver, informers.NewSharedInformerFactory(client, 0), WithEventRecorder(record.NewFakeRecorder(10)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(t.Context(), pv); err == nil || !strings.Contains(err.Error(), "volumeattachments not read yet") {
		t.Errorf("Delete = %v, want the attachments not read yet", err)
	}
	if !p.ShouldDelete(t.Context(), pv) {
		t.Error("ShouldDelete = false; want true, for Delete to report it")
	}
	if calls := driver.deleteCalls(); len(calls) != 0 {
		t.Errorf("DeleteVolume called %d times", len(calls))
	}
}

// TestShouldDeleteAfterLibraryFinished: once the library's patch through
// LibraryClient has removed its finalizer from a PV being deleted, a copy
// of that PV from before the patch does not reach Delete again. Anything
// else the record does not cover goes through as before.
func TestShouldDeleteAfterLibraryFinished(t *testing.T) {
	now := metav1.Now()
	deleting := provisionedPV("", "").Obj()
	deleting.UID = "uid-pv1"
	deleting.DeletionTimestamp = &now
	deleting.Finalizers = []string{libraryVolumeFinalizer, "kubernetes.io/pv-protection"}
	dropFinalizer := `{"metadata":{"finalizers":["kubernetes.io/pv-protection"]}}`
	tests := []struct {
		name     string
		live     *corev1.PersistentVolume // on the API server before the patch
		patch    string
		patchErr bool
		elapsed  time.Duration
		want     bool
	}{
		{name: "the library removed its finalizer", live: deleting, patch: dropFinalizer},
		{name: "the removal failed", live: deleting, patch: dropFinalizer, patchErr: true, want: true},
		{name: "a patch that keeps the finalizer", live: deleting, patch: `{"metadata":{"labels":{"a":"b"}}}`, want: true},
		{
			name: "a PV not being deleted", patch: dropFinalizer, want: true,
			live: func() *corev1.PersistentVolume {
				pv := deleting.DeepCopy()
				pv.DeletionTimestamp = nil
				return pv
			}(),
		},
		{name: "finished too long ago", live: deleting, patch: dropFinalizer, elapsed: finishedTTL, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			h := newHarness(t, baseCaps(), objs(tt.live), WithClock(clk))
			if tt.patchErr {
				h.client.PrependReactor("patch", "persistentvolumes", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("connection refused")
				})
			}
			_, err := h.p.LibraryClient(h.client).CoreV1().PersistentVolumes().Patch(h.ctx, tt.live.Name, types.MergePatchType, []byte(tt.patch), metav1.PatchOptions{})
			if (err != nil) != tt.patchErr {
				t.Fatalf("Patch: %v", err)
			}
			clk.Step(tt.elapsed)
			if got := h.p.ShouldDelete(h.ctx, deleting); got != tt.want {
				t.Errorf("ShouldDelete(copy from before the patch) = %v, want %v", got, tt.want)
			}
			if calls := h.driver.deleteCalls(); len(calls) != 0 {
				t.Errorf("DeleteVolume called %d times", len(calls))
			}
		})
	}
}

// TestFinishedDeletionsPrune: the record forgets deletions after
// finishedTTL and drops them, so it does not grow with every deletion.
func TestFinishedDeletionsPrune(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFinishedDeletions(clk)
	f.Add("a")
	clk.Step(finishedTTL / 2)
	f.Add("b")
	if !f.Has("a") || !f.Has("b") {
		t.Fatal("fresh entries forgotten")
	}
	clk.Step(finishedTTL / 2)
	if f.Has("a") || !f.Has("b") {
		t.Errorf("has(a) = %v, has(b) = %v after one TTL; want false, true", f.Has("a"), f.Has("b"))
	}
	f.Add("c") // prunes a
	if n := f.Len(); n != 2 {
		t.Errorf("%d entries after pruning, want 2 (b, c)", n)
	}
}

// TestDeleteVolumeOnceAcrossRetries: the library calls Delete again when
// it could not delete the PV object after DeleteVolume succeeded (the API
// server was down, or refused the write): DeleteVolume is not called again
// for a volume of that PV it deleted less than deletedVolumeTTL ago. A
// failed DeleteVolume, another PV (another UID) of the same volume, and a
// deletion older than the TTL are called again.
func TestDeleteVolumeOnceAcrossRetries(t *testing.T) {
	pv := provisionedPV("", "").Obj()
	pv.UID = "uid-pv1"
	other := pv.DeepCopy()
	other.UID = "uid-pv1-again"
	tests := []struct {
		name       string
		deleteErrs []error
		second     *corev1.PersistentVolume
		elapsed    time.Duration
		wantCalls  int
	}{
		{name: "retry after the PV could not be deleted", second: pv, wantCalls: 1},
		{name: "the first DeleteVolume failed", deleteErrs: []error{csiErr(codes.Unavailable)}, second: pv, wantCalls: 2},
		{name: "another PV of the same volume", second: other, wantCalls: 2},
		{name: "deleted too long ago", second: pv, elapsed: deletedVolumeTTL, wantCalls: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			h := newHarness(t, baseCaps(), nil, WithClock(clk))
			h.driver.deleteErrs = tt.deleteErrs
			err := h.p.Delete(h.ctx, pv)
			if (err != nil) != (len(tt.deleteErrs) > 0) {
				t.Fatalf("first Delete: %v", err)
			}
			clk.Step(tt.elapsed)
			if err := h.p.Delete(h.ctx, tt.second); err != nil {
				t.Fatalf("second Delete: %v", err)
			}
			if calls := h.driver.deleteCalls(); len(calls) != tt.wantCalls {
				t.Errorf("DeleteVolume called %d times, want %d", len(calls), tt.wantCalls)
			}
		})
	}
}

// TestNoPVCreateForDeletedVolume: the library's background retry of a PV
// create whose answer was lost, coming after that PV's volume was deleted,
// is not sent (TestLostPVCreateNotRepeatedAfterDeletion in
// test/integration shows the second DeleteVolume it caused). A volume a
// CreateVolume returned since the deletion, another volume, a volume
// deleted longer than deletedVolumeTTL ago and a failed DeleteVolume
// leave the create as it was.
func TestNoPVCreateForDeletedVolume(t *testing.T) {
	tests := []struct {
		name         string
		deleteErrs   []error
		createAgain  bool // the claim is provisioned again after the deletion
		otherHandle  bool // the create is of a PV of another volume
		migrated     bool // an in-tree class migrated to the driver: the PV is in-tree
		elapsed      time.Duration
		wantCreatePV bool
	}{
		{name: "retry after the volume was deleted"},
		{name: "CreateVolume returned the volume again", createAgain: true, wantCreatePV: true},
		{name: "another volume", otherHandle: true, wantCreatePV: true},
		{name: "deleted too long ago", elapsed: deletedVolumeTTL, wantCreatePV: true},
		{name: "DeleteVolume failed", deleteErrs: []error{csiErr(codes.Unavailable)}, wantCreatePV: true},
		{name: "migrated in-tree volume, retry after it was deleted", migrated: true},
		{name: "migrated in-tree volume, CreateVolume returned it again", migrated: true, createAgain: true, wantCreatePV: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim, class := newClaim("c").Obj(), newClass().Obj()
			caps, opts := baseCaps(), []Option{}
			if tt.migrated {
				claim, class = ebsClaim("c").Obj(), testutil.NewSC("gp2", ebsInTree).Obj()
				caps, opts = ebsCaps(), append(opts, WithInTreeMigration(ebsInTree))
			}
			clk := clocktesting.NewFakeClock(time.Now())
			h := newHarness(t, caps, append(cluster(), claim, class), append(opts, WithClock(clk))...)
			pv, _, err := h.provision(claim, class)
			if err != nil {
				t.Fatalf("Provision: %v", err)
			}
			if tt.migrated && (pv.Spec.CSI != nil || pv.Spec.AWSElasticBlockStore == nil) {
				t.Fatalf("PV source = %+v, want the in-tree one", pv.Spec.PersistentVolumeSource)
			}
			released := pv.DeepCopy()
			released.UID = "uid-pv"
			released.Status.Phase = corev1.VolumeReleased
			h.driver.deleteErrs = tt.deleteErrs
			if err := h.p.Delete(h.ctx, released); (err != nil) != (len(tt.deleteErrs) > 0) {
				t.Fatalf("Delete: %v", err)
			}
			if tt.createAgain {
				if _, _, err := h.provision(claim, class); err != nil {
					t.Fatalf("second Provision: %v", err)
				}
			}
			clk.Step(tt.elapsed)
			if tt.otherHandle {
				pv.Spec.CSI.VolumeHandle = "id-other"
			}
			h.client.ClearActions()
			got, err := h.p.LibraryClient(h.client).CoreV1().PersistentVolumes().Create(h.ctx, pv, metav1.CreateOptions{})
			if err != nil || got == nil || got.Name != pv.Name {
				t.Fatalf("Create = %v, %v; want the PV and no error", got, err)
			}
			if created := slices.Contains(h.writes(), "create persistentvolumes"); created != tt.wantCreatePV {
				t.Errorf("PV create sent = %v, want %v", created, tt.wantCreatePV)
			}
		})
	}
}

// TestUnsavedVolumeExplained: the library's queue of unsaved PVs retries a
// refused PV create for ever and only logs; the library client posts the
// refusal as a Warning on the claim the PV records (by UID), and nothing
// for a PV that already exists or whose claim is another.
func TestUnsavedVolumeExplained(t *testing.T) {
	denied := apierrors.NewForbidden(corev1.Resource("persistentvolumes"), "pvc-uid-c",
		errors.New(`admission webhook "pv-policy.example.com" denied the request: PersistentVolumes must carry label team`))
	tests := []struct {
		name      string
		err       error
		claimUID  string
		wantEvent string
	}{
		{name: "refused", err: denied, claimUID: "uid-c",
			wantEvent: "Warning ProvisioningFailed volume pvc-uid-c was created, but its PersistentVolume pvc-uid-c could not be saved (retried with backoff; the claim keeps finalizer " +
				inflight.Finalizer + " until it is): persistentvolumes \"pvc-uid-c\" is forbidden: admission webhook"},
		{name: "already exists (saved before)", err: apierrors.NewAlreadyExists(corev1.Resource("persistentvolumes"), "pvc-uid-c"), claimUID: "uid-c"},
		{name: "claim recreated under the same name", err: denied, claimUID: "uid-old"},
		{name: "saved", claimUID: "uid-c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := newClaim("c").Obj()
			h := newHarness(t, baseCaps(), objs(claim))
			if tt.err != nil {
				h.failOn("create", "persistentvolumes", tt.err)
			}
			pv := testutil.NewPV("pvc-uid-c", testDriver).ClaimRef(testNS, "c", tt.claimUID).Obj()
			pv.Spec.CSI.VolumeHandle = "pvc-uid-c"
			if _, err := h.p.LibraryClient(h.client).CoreV1().PersistentVolumes().Create(h.ctx, pv, metav1.CreateOptions{}); (err != nil) != (tt.err != nil) {
				t.Fatalf("Create = %v, want %v", err, tt.err)
			}
			events := h.events()
			if tt.wantEvent == "" && len(events) > 0 || tt.wantEvent != "" && (len(events) != 1 || !strings.HasPrefix(events[0], tt.wantEvent)) {
				t.Errorf("events = %q, want %q", events, tt.wantEvent)
			}
		})
	}
}
