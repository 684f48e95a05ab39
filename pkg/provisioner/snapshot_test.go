package provisioner

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	snapfake "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/fake"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
)

func snapshotCaps() csiclient.Capabilities {
	c := baseCaps()
	c.CreateDeleteSnapshot = true
	return c
}

// readySnapshot is a VolumeSnapshot "snap" of testNS bound to content
// "content-1" of the test driver with handle "snap-handle", 1Gi.
func readySnapshot() (*snapv1.VolumeSnapshot, *snapv1.VolumeSnapshotContent) {
	snap := &snapv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "snap", UID: types.UID("uid-snap")},
		Status: &snapv1.VolumeSnapshotStatus{
			BoundVolumeSnapshotContentName: ptr.To("content-1"),
			ReadyToUse:                     ptr.To(true),
			RestoreSize:                    ptr.To(resource.MustParse("1Gi")),
		},
	}
	fs := corev1.PersistentVolumeFilesystem
	content := &snapv1.VolumeSnapshotContent{
		ObjectMeta: metav1.ObjectMeta{Name: "content-1"},
		Spec: snapv1.VolumeSnapshotContentSpec{
			VolumeSnapshotRef: corev1.ObjectReference{Namespace: testNS, Name: "snap", UID: snap.UID},
			Driver:            testDriver,
			SourceVolumeMode:  &fs,
		},
		Status: &snapv1.VolumeSnapshotContentStatus{SnapshotHandle: ptr.To("snap-handle")},
	}
	return snap, content
}

func restoreOf(name string) *corev1.PersistentVolumeClaim {
	group := snapshotAPIGroup
	return newClaim("restored").DataSource(&group, kindVolumeSnapshot, name).Obj()
}

func TestRestore(t *testing.T) {
	tests := []struct {
		name    string
		caps    csiclient.Capabilities
		claim   *corev1.PersistentVolumeClaim
		edit    func(*snapv1.VolumeSnapshot, *snapv1.VolumeSnapshotContent)
		noSnap  bool
		noClnt  bool
		prevent *bool
		// createErr makes CreateVolume fail with this code.
		createErr     codes.Code
		wantState     controller.ProvisioningState
		wantErr       string
		wantFinalizer bool // on the snapshot afterwards
	}{
		{name: "restore: the snapshot's handle is the content source, protection removed after", wantState: controller.ProvisioningFinished},
		{
			name: "a bigger claim than the restore size", claim: newClaim("restored").Size("5Gi").DataSource(ptr.To(snapshotAPIGroup), kindVolumeSnapshot, "snap").Obj(),
			wantState: controller.ProvisioningFinished,
		},
		{name: "a driver without CREATE_DELETE_SNAPSHOT", caps: baseCaps(), wantState: controller.ProvisioningFinished, wantErr: "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"},
		{name: "no snapshot client", noClnt: true, wantState: controller.ProvisioningFinished, wantErr: errNoSnapshotClient.Error()},
		{name: "snapshot missing", noSnap: true, wantState: controller.ProvisioningNoChange, wantErr: "error getting handle for DataSource Type VolumeSnapshot by Name snap: error getting snapshot snap from api server"},
		{
			name: "snapshot being deleted", wantState: controller.ProvisioningNoChange, wantErr: "snapshot snap is being deleted",
			edit: func(s *snapv1.VolumeSnapshot, _ *snapv1.VolumeSnapshotContent) {
				s.DeletionTimestamp = ptr.To(metav1.Now())
			},
		},
		{
			name: "snapshot being deleted after a restore started: it goes on", wantState: controller.ProvisioningFinished,
			edit: func(s *snapv1.VolumeSnapshot, _ *snapv1.VolumeSnapshotContent) {
				s.DeletionTimestamp = ptr.To(metav1.Now())
				s.Finalizers = []string{SnapshotFinalizer, "other"}
			},
		},
		{
			name: "snapshot not bound", wantState: controller.ProvisioningNoChange, wantErr: "snapshot snap not bound",
			edit: func(s *snapv1.VolumeSnapshot, _ *snapv1.VolumeSnapshotContent) {
				s.Status.BoundVolumeSnapshotContentName = nil
			},
		},
		{
			name: "content missing", wantState: controller.ProvisioningNoChange, wantErr: "error getting snapshotcontent content-2 for snapshot snap",
			edit: func(s *snapv1.VolumeSnapshot, _ *snapv1.VolumeSnapshotContent) {
				s.Status.BoundVolumeSnapshotContentName = ptr.To("content-2")
			},
		},
		{
			name: "content of another snapshot", wantState: controller.ProvisioningNoChange, wantErr: "snapshotcontent content-1 for snapshot snap is bound to a different snapshot",
			edit: func(_ *snapv1.VolumeSnapshot, c *snapv1.VolumeSnapshotContent) {
				c.Spec.VolumeSnapshotRef.UID = "uid-old"
			},
		},
		{
			name: "content of another driver", wantState: controller.ProvisioningNoChange, wantErr: "snapshotcontent content-1 for snapshot snap is not handled by CSI driver of StorageClass sc",
			edit: func(_ *snapv1.VolumeSnapshot, c *snapv1.VolumeSnapshotContent) { c.Spec.Driver = "other.csi" },
		},
		{
			name: "not ready", wantState: controller.ProvisioningNoChange, wantErr: "snapshot snap is not Ready",
			edit: func(s *snapv1.VolumeSnapshot, _ *snapv1.VolumeSnapshotContent) { s.Status.ReadyToUse = ptr.To(false) },
		},
		{
			name: "no handle", wantState: controller.ProvisioningNoChange, wantErr: "snapshot handle snap is not available",
			edit: func(_ *snapv1.VolumeSnapshot, c *snapv1.VolumeSnapshotContent) { c.Status.SnapshotHandle = nil },
		},
		{
			name: "restore size over the request", wantState: controller.ProvisioningNoChange, wantErr: "requested volume size 1073741824 is less than the size 2147483648 for the source snapshot snap",
			edit: func(s *snapv1.VolumeSnapshot, _ *snapv1.VolumeSnapshotContent) {
				s.Status.RestoreSize = ptr.To(resource.MustParse("2Gi"))
			},
		},
		{
			name: "a Block source restored as Filesystem, not allowed", wantState: controller.ProvisioningNoChange,
			wantErr: "modifies the mode of the source volume but does not have permission to do so. snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content-1",
			edit: func(_ *snapv1.VolumeSnapshot, c *snapv1.VolumeSnapshotContent) {
				c.Spec.SourceVolumeMode = ptr.To(corev1.PersistentVolumeBlock)
			},
		},
		{
			name: "a mode change the content allows", wantState: controller.ProvisioningFinished,
			edit: func(_ *snapv1.VolumeSnapshot, c *snapv1.VolumeSnapshotContent) {
				c.Spec.SourceVolumeMode = ptr.To(corev1.PersistentVolumeBlock)
				c.Annotations = map[string]string{annAllowVolumeModeChange: "true"}
			},
		},
		{
			name: "a mode change the content forbids", wantState: controller.ProvisioningNoChange, wantErr: "allow-volume-mode-change is set to false on snapshotcontent content-1",
			edit: func(_ *snapv1.VolumeSnapshot, c *snapv1.VolumeSnapshotContent) {
				c.Spec.SourceVolumeMode = ptr.To(corev1.PersistentVolumeBlock)
				c.Annotations = map[string]string{annAllowVolumeModeChange: "false"}
			},
		},
		{
			name: "a mode change with --prevent-volume-mode-conversion=false", prevent: ptr.To(false), wantState: controller.ProvisioningFinished,
			edit: func(_ *snapv1.VolumeSnapshot, c *snapv1.VolumeSnapshotContent) {
				c.Spec.SourceVolumeMode = ptr.To(corev1.PersistentVolumeBlock)
			},
		},
		{name: "a final CreateVolume error releases the snapshot", createErr: codes.NotFound, wantState: controller.ProvisioningFinished, wantErr: "NotFound"},
		{name: "a CreateVolume that may still run keeps it protected", createErr: codes.DeadlineExceeded, wantState: controller.ProvisioningInBackground, wantErr: "DeadlineExceeded", wantFinalizer: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap, content := readySnapshot()
			if tt.edit != nil {
				tt.edit(snap, content)
			}
			var snapObjs []runtime.Object
			if !tt.noSnap {
				snapObjs = append(snapObjs, snap)
			}
			snapObjs = append(snapObjs, content)
			snaps := snapfake.NewSimpleClientset(snapObjs...) //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
			claim := tt.claim
			if claim == nil {
				claim = restoreOf("snap")
			}
			caps := tt.caps
			if caps.DriverName == "" {
				caps = snapshotCaps()
			}
			var opts []Option
			if !tt.noClnt {
				opts = append(opts, WithSnapshotClient(snaps))
			}
			if tt.prevent != nil {
				opts = append(opts, WithPreventVolumeModeConversion(*tt.prevent))
			}
			class := newClass().Obj()
			h := newHarness(t, caps, objs(claim, class), opts...)
			if tt.createErr != codes.OK {
				h.driver.createAnswers = []createAnswer{{err: csiErr(tt.createErr)}}
			}
			pv, state, err := h.provision(claim, class)
			if state != tt.wantState || !strings.Contains(errString(err), tt.wantErr) || (tt.wantErr == "") != (err == nil) {
				t.Fatalf("Provision = %v, %q; want %v, %q", state, errString(err), tt.wantState, tt.wantErr)
			}
			creates := h.driver.createCalls()
			if tt.wantErr != "" && tt.createErr == codes.OK {
				if pv != nil || len(creates) != 0 {
					t.Errorf("a refused restore gave a PV (%v) or %d CreateVolume calls", pv != nil, len(creates))
				}
				return
			}
			if len(creates) != 1 || creates[0].GetVolumeContentSource().GetSnapshot().GetSnapshotId() != "snap-handle" {
				t.Fatalf("CreateVolume calls %v, want one from snapshot snap-handle", creates)
			}
			var updates int
			for _, a := range snaps.Actions() {
				if a.GetVerb() == "update" && a.GetResource().Resource == "volumesnapshots" {
					updates++
				}
			}
			live, err := snaps.SnapshotV1().VolumeSnapshots(testNS).Get(t.Context(), "snap", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := slices.Contains(live.Finalizers, SnapshotFinalizer); got != tt.wantFinalizer {
				t.Errorf("snapshot finalizers %v after %d updates; want %s: %v", live.Finalizers, updates, SnapshotFinalizer, tt.wantFinalizer)
			}
			if updates == 0 && !slices.Contains(snap.Finalizers, SnapshotFinalizer) {
				t.Errorf("the snapshot was never protected")
			}
		})
	}
}

func TestSnapshotSweep(t *testing.T) {
	group := ptr.To(snapshotAPIGroup)
	protected := func(ns, name string, finalizers ...string) *snapv1.VolumeSnapshot {
		return &snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: append([]string{SnapshotFinalizer}, finalizers...)}}
	}
	restoring := func(name, snap string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		return newClaim(name).DataSource(group, kindVolumeSnapshot, snap).Phase(phase).Obj()
	}
	refOnly := restoring("ref-only", "b", corev1.ClaimPending)
	refOnly.Spec.DataSource = nil
	otherGroup := restoring("other-group", "e", corev1.ClaimPending)
	otherGroup.Spec.DataSource.APIGroup = ptr.To("example.com")
	otherGroup.Spec.DataSourceRef.APIGroup = ptr.To("example.com")

	// The sweep lists the snapshots, or reads them from the snapshot
	// informer's cache when it has one.
	for _, cached := range []bool{false, true} {
		t.Run(map[bool]string{false: "listed", true: "cached"}[cached], func(t *testing.T) {
			snaps := snapfake.NewSimpleClientset( //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
				protected(testNS, "a"),          // a pending restore: kept
				protected(testNS, "b"),          // a pending restore through dataSourceRef: kept
				protected(testNS, "c", "other"), // its restore is Bound: removed, "other" kept
				protected(testNS, "d"),          // no claim: removed
				protected(testNS, "e"),          // only a claim of another API group: removed
				protected("elsewhere", "a"),     // a pending claim of another namespace: removed
				&snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "f", Finalizers: []string{"other"}}}, // not ours: untouched
			)
			opts := []Option{WithSnapshotClient(snaps)}
			if cached {
				opts = append(opts, WithSnapshotInformer(runSnapshotInformer(t, snaps)))
			}
			claims := objs(restoring("r-a", "a", corev1.ClaimPending), refOnly, restoring("r-c", "c", corev1.ClaimBound), otherGroup)
			h := newHarness(t, snapshotCaps(), claims, opts...)
			snaps.ClearActions()
			if err := h.p.sweepSnapshots(h.ctx); err != nil {
				t.Fatal(err)
			}
			listed := slices.ContainsFunc(snaps.Actions(), func(a k8stesting.Action) bool { return a.GetVerb() == "list" })
			if listed == cached {
				t.Errorf("the sweep listed the snapshots: %v, want %v", listed, !cached)
			}
			want := map[string][]string{
				testNS + "/a": {SnapshotFinalizer}, testNS + "/b": {SnapshotFinalizer}, testNS + "/c": {"other"},
				testNS + "/d": nil, testNS + "/e": nil, "elsewhere/a": nil, testNS + "/f": {"other"},
			}
			list, err := snaps.SnapshotV1().VolumeSnapshots("").List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range list.Items {
				key := s.Namespace + "/" + s.Name
				if got := s.Finalizers; !slices.Equal(got, want[key]) {
					t.Errorf("snapshot %s finalizers %v, want %v", key, got, want[key])
				}
			}
		})
	}
}

// TestSnapshotSweepAtStart: the first sweep runs as soon as the claims are
// known, not one interval later.
func TestSnapshotSweepAtStart(t *testing.T) {
	left := &snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "left", Finalizers: []string{SnapshotFinalizer}}}
	snaps := snapfake.NewSimpleClientset(left) //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
	h := newHarness(t, snapshotCaps(), nil, WithSnapshotClient(snaps))
	go h.p.RunSnapshotSweep(h.ctx, time.Hour) // returns when the test ends
	testutil.Eventually(t, 0, "the protection left on a snapshot was not swept at start", func(ctx context.Context) (bool, error) {
		s, err := snaps.SnapshotV1().VolumeSnapshots(testNS).Get(ctx, "left", metav1.GetOptions{})
		return err == nil && len(s.Finalizers) == 0, err
	})
}

// runSnapshotInformer runs NewSnapshotInformer on snaps until the test
// ends and waits for it to sync.
func runSnapshotInformer(t *testing.T, snaps snapclient.Interface) cache.SharedIndexInformer {
	t.Helper()
	inf := NewSnapshotInformer(snaps)
	go inf.RunWithContext(t.Context())
	if !cache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("the snapshot informer did not sync")
	}
	return inf
}

// TestSnapshotSweepWithoutSnapshotAPI: a cluster that serves no snapshot
// API has nothing to sweep and no error to report.
func TestSnapshotSweepWithoutSnapshotAPI(t *testing.T) {
	snaps := snapfake.NewSimpleClientset() //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
	snaps.PrependReactor("list", "volumesnapshots", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(snapv1.Resource("volumesnapshots"), "")
	})
	h := newHarness(t, snapshotCaps(), nil, WithSnapshotClient(snaps))
	if err := h.p.sweepSnapshots(h.ctx); err != nil {
		t.Errorf("sweep without the snapshot API: %v", err)
	}
}

// TestRestoreKeepsProtectionForOtherRestores: two claims restore from the
// same snapshot. The first restore done must not remove the snapshot's
// protection while the second one's CreateVolume still reads the snapshot;
// the last one done removes it.
func TestRestoreKeepsProtectionForOtherRestores(t *testing.T) {
	group := ptr.To(snapshotAPIGroup)
	first := newClaim("first").DataSource(group, kindVolumeSnapshot, "snap").Obj()
	second := newClaim("second").DataSource(group, kindVolumeSnapshot, "snap").Obj()
	snap, content := readySnapshot()
	snaps := snapfake.NewSimpleClientset(snap, content) //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
	class := newClass().Obj()
	h := newHarness(t, snapshotCaps(), objs(first, second, class), WithSnapshotClient(snaps))
	protected := func() bool {
		t.Helper()
		live, err := snaps.SnapshotV1().VolumeSnapshots(testNS).Get(t.Context(), "snap", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(live.Finalizers, SnapshotFinalizer)
	}

	// While the second claim's CreateVolume runs, the first claim is
	// restored.
	var during bool
	h.driver.onCreate = func(req *csi.CreateVolumeRequest) {
		if req.GetName() != h.p.VolumeName(second) {
			return
		}
		if _, state, err := h.provision(first, class); err != nil || state != controller.ProvisioningFinished {
			t.Errorf("Provision(first) = %v, %v", state, err)
		}
		during = protected()
	}
	if _, state, err := h.provision(second, class); err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision(second) = %v, %v", state, err)
	}
	if !during {
		t.Errorf("the first restore done removed the protection of the snapshot while the second one's CreateVolume ran")
	}
	if protected() {
		t.Errorf("the last restore done left the snapshot protected")
	}
}

// TestRestoreReleasesProtectionAfterOthersFailed: a claim whose restore got
// a final CreateVolume answer no longer reads the snapshot, so it does not
// keep the snapshot protected once the last running restore is done.
func TestRestoreReleasesProtectionAfterOthersFailed(t *testing.T) {
	group := ptr.To(snapshotAPIGroup)
	failed := newClaim("failed").DataSource(group, kindVolumeSnapshot, "snap").Obj()
	restored := newClaim("restored").DataSource(group, kindVolumeSnapshot, "snap").Obj()
	snap, content := readySnapshot()
	snaps := snapfake.NewSimpleClientset(snap, content) //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
	class := newClass().Obj()
	h := newHarness(t, snapshotCaps(), objs(failed, restored, class), WithSnapshotClient(snaps))

	h.driver.createAnswers = []createAnswer{{err: csiErr(codes.Internal)}}
	if _, state, err := h.provision(failed, class); err == nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision(failed) = %v, %v; want a final error", state, err)
	}
	h.driver.createAnswers = nil
	if _, state, err := h.provision(restored, class); err != nil || state != controller.ProvisioningFinished {
		t.Fatalf("Provision(restored) = %v, %v", state, err)
	}
	live, err := snaps.SnapshotV1().VolumeSnapshots(testNS).Get(t.Context(), "snap", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(live.Finalizers, SnapshotFinalizer) {
		t.Errorf("the snapshot stays protected for a claim whose restore got a final answer: finalizers %v", live.Finalizers)
	}
}

// TestRestoreOfDeletedClaimNeverStarted: a claim being deleted without the
// in-flight finalizer never had a CreateVolume, and gets none; nor does its
// snapshot get the source protection, which nothing would remove but the
// sweep.
func TestRestoreOfDeletedClaimNeverStarted(t *testing.T) {
	claim := newClaim("restored").DataSource(ptr.To(snapshotAPIGroup), kindVolumeSnapshot, "snap").Deleted().Obj()
	snap, content := readySnapshot()
	snaps := snapfake.NewSimpleClientset(snap, content) //nolint:staticcheck // this clientset has no NewClientset (no apply configurations)
	class := newClass().Obj()
	h := newHarness(t, snapshotCaps(), objs(claim, class), WithSnapshotClient(snaps))
	if _, state, err := h.provision(claim, class); !isIgnoredError(err) || state != controller.ProvisioningFinished {
		t.Fatalf("Provision = %v, %v; want an ignored error", state, err)
	}
	for _, a := range snaps.Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("the snapshot API got a %s of %s for a claim that gets no CreateVolume", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if n := len(h.driver.createCalls()); n != 0 {
		t.Errorf("%d CreateVolume calls, want none", n)
	}
}
