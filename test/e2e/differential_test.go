package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// The test in this file checks the drop-in promise request by request: for
// the same flags, class and claim, this sidecar sends the driver the same
// CreateVolumeRequest as upstream external-provisioner and creates the
// same PV. The cases are in differential_cases_test.go.

// diffCase is one claim provisioned by both sidecars.
type diffCase struct {
	name string
	// class changes the case's class (of the side's driver), claim the
	// case's claim (in the side's namespace, of that class).
	class func(*storagev1.StorageClass)
	claim func(*testutil.PVCBuilder)
	// noCreate: neither sidecar may call CreateVolume for the claim (it is
	// checked once every other claim of the group has its PV, a weak
	// check: the claim was created first).
	noCreate bool
	// vac names the side's VolumeAttributesClass in the claim.
	vac bool
	// fails: the claim cannot be provisioned; the sides' Warning events
	// on it are compared.
	fails bool
}

// diffGroup is the cases that run with one set of flags, on one sidecar of
// each kind, with a recording driver each.
type diffGroup struct {
	name  string
	flags []string
	// noTopology: the driver does not report VOLUME_ACCESSIBILITY_CONSTRAINTS.
	noTopology bool
	// publish: the driver reports PUBLISH_UNPUBLISH_VOLUME, so both
	// sidecars check VolumeAttachments before DeleteVolume.
	publish bool
	// uuidLength is --volume-name-uuid-length, to recognise claim UIDs in
	// volume names.
	uuidLength int
	// capacity: the driver reports GET_CAPACITY (see
	// recordingDriver.GetCapacity), and the sidecar runs as the pod
	// diffPod that e2e.CreateOwnerChain makes in the side's namespace,
	// with NAMESPACE and POD_NAME set, as --enable-capacity needs.
	capacity bool
	cases    []diffCase
}

// Topology of the nodes the differential test registers its drivers on:
// diff-n1 and diff-n2 report both keys, diff-n3 has the driver but no
// topology keys in its CSINode (as a node whose driver has not registered
// its topology), diff-n4 has no CSINode entry for the driver.
const (
	diffZone = "diff.kube-storage.io/zone"
	diffRack = "diff.kube-storage.io/rack"
)

var diffNodes = []struct {
	name   string
	labels map[string]string
	keys   []string
	driver bool
}{
	{"diff-n1", map[string]string{diffZone: "a", diffRack: "1"}, []string{diffZone, diffRack}, true},
	{"diff-n2", map[string]string{diffZone: "b", diffRack: "2"}, []string{diffZone, diffRack}, true},
	{"diff-n3", map[string]string{diffZone: "c", diffRack: "3"}, nil, true},
	{"diff-n4", map[string]string{diffZone: "d", diffRack: "4"}, nil, false},
}

// diffBinaries returns the binaries the differential tests compare:
// upstream external-provisioner's (built by hack/tools) and this sidecar's.
func diffBinaries(t *testing.T) (upstream, ours string) {
	t.Helper()
	upstream, err := e2e.UpstreamProvisioner()
	if err != nil {
		t.Fatalf("upstream external-provisioner (hack/tools/build.sh external-provisioner): %v", err)
	}
	bins, err := e2e.Build(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	return upstream, bins.Sidecar
}

// TestDifferentialCreateVolume provisions each case's claim once with
// upstream external-provisioner v6.3.0 and once with this sidecar, both
// against a driver that records what it receives, and compares the
// CreateVolumeRequests and the PVs as created, after normalising what must
// differ (namespace, driver and class names, claim UIDs, the provisioner
// identity, object metadata the API server sets). Differences that are
// intended are listed in README.md; none is in CreateVolume or the new PV.
func TestDifferentialCreateVolume(t *testing.T) {
	cp := controlplane.Need(t, shared)
	upBin, ourBin := diffBinaries(t)
	if err := e2e.InstallSnapshotCRDs(t.Context(), cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	for _, g := range diffGroups() {
		t.Run(g.name, func(t *testing.T) {
			up := startDiffSide(t, cp, "upstream", upBin, g)
			ours := startDiffSide(t, cp, "ours", ourBin, g)
			up.create()
			ours.create()
			up.wait()
			ours.wait()
			for _, c := range g.cases {
				upReq, oursReq := up.request(c.name), ours.request(c.name)
				if c.fails {
					if d := cmp.Diff(up.warnings(c.name), ours.warnings(c.name)); d != "" {
						t.Errorf("%s: Warning events differ (-upstream +ours):\n%s", c.name, d)
					}
					continue
				}
				if !c.noCreate && (upReq == nil || oursReq == nil) {
					t.Errorf("%s: CreateVolume not recorded: upstream %v, ours %v", c.name, upReq != nil, oursReq != nil)
				}
				if d := cmp.Diff(upReq, oursReq, protocmp.Transform()); d != "" {
					t.Errorf("%s: CreateVolumeRequest differs (-upstream +ours):\n%s", c.name, d)
				}
				if d := cmp.Diff(up.pv(c.name), ours.pv(c.name)); d != "" {
					t.Errorf("%s: PV differs (-upstream +ours):\n%s", c.name, d)
				}
			}
		})
	}
}

// diffSide is one sidecar of a group, with its driver, namespace and what
// it did.
type diffSide struct {
	t      *testing.T
	c      kubernetes.Interface
	snaps  snapclient.Interface
	group  diffGroup
	ns     string
	driver *recordingDriver
	// pvs are the PVs as created, by claim name.
	mu     sync.Mutex
	pvs    map[string]*corev1.PersistentVolume
	claims map[string]*corev1.PersistentVolumeClaim
	// replace normalises: each pair's first string becomes its second, in
	// order.
	replace [][2]string
}

func startDiffSide(t *testing.T, cp *controlplane.ControlPlane, kind, bin string, g diffGroup) *diffSide {
	t.Helper()
	c := cp.Client()
	snaps, err := snapclient.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := generatedNamespace(t, c, "diff-"+kind+"-")
	s := &diffSide{
		t: t, c: c, snaps: snaps, group: g, ns: ns,
		pvs: map[string]*corev1.PersistentVolume{}, claims: map[string]*corev1.PersistentVolumeClaim{},
	}
	s.driver = &recordingDriver{
		controllerDriver: controllerDriver{name: ns + ".diff.csi.kube-storage.io", topology: !g.noTopology},
		publish:          g.publish,
		capacity:         g.capacity,
		capacityFailing:  g.capacity,
		requests:         map[string]*csi.CreateVolumeRequest{},
		deleteErrs:       map[string]*deleteScript{},
	}
	s.registerNodes()
	s.watch()
	socket := serveDriver(t, s.driver)
	t.Cleanup(s.cleanup)
	// Registered after the driver's and the cleanup's: the sidecar stops
	// first.
	logPath := filepath.Join(filepath.Dir(socket), "sidecar.log")
	var env []string
	if g.capacity {
		deploy, err := e2e.CreateOwnerChain(t.Context(), c, ns, diffPod)
		if err != nil {
			t.Fatal(err)
		}
		s.replace = append(s.replace, [2]string{string(deploy.UID), "UID-Deployment"})
		env = []string{"NAMESPACE=" + ns, "POD_NAME=" + diffPod}
		if kind == "upstream" {
			// Upstream v6.3.0's capacity controller sorts the topology
			// keys of CSINodes in its informer cache
			// (pkg/capacity/topology/nodes.go): the detector panics.
			env = append(env, e2e.MutationDetectorEnv+"=false")
		}
	}
	sidecar, err := e2e.StartSidecar(bin, e2e.SidecarConfig{
		Kubeconfig: cp.KubeconfigPath, Socket: socket, LogPath: logPath,
		Args: append([]string{"-v=5", "--retry-interval-start=200ms", "--retry-interval-max=2s"}, g.flags...),
		Env:  env,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sidecar.Stop(10 * time.Second)
		e2e.CheckLog(t, logPath)
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				var failed []string
				for _, l := range strings.Split(string(b), "\n") {
					if strings.Contains(l, "rror") || strings.Contains(l, "Fail") {
						failed = append(failed, l)
					}
				}
				t.Logf("%s sidecar log, errors:\n%s", kind, strings.Join(failed, "\n"))
			}
		}
	})
	if err := sidecar.WaitLog(t.Context(), "Started provisioner controller"); err != nil {
		t.Fatal(err)
	}
	return s
}

// registerNodes makes sure the nodes of diffNodes exist with their labels,
// and adds the side's driver to their CSINodes.
func (s *diffSide) registerNodes() {
	ctx := s.t.Context()
	for _, n := range diffNodes {
		node, err := s.c.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			node := testutil.NewNode(n.name, n.labels)
			node.ResourceVersion = ""
			_, err = s.c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				err = nil
			}
		} else if err == nil && !cmp.Equal(node.Labels, n.labels) {
			node = node.DeepCopy()
			node.Labels = n.labels
			_, err = s.c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		}
		if err != nil {
			s.t.Fatal(err)
		}
		if !n.driver {
			continue
		}
		entry := storagev1.CSINodeDriver{Name: s.driver.name, NodeID: n.name, TopologyKeys: n.keys}
		for {
			csiNode, err := s.c.StorageV1().CSINodes().Get(ctx, n.name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				csiNode := testutil.NewCSINode(n.name, s.driver.name, n.keys...)
				csiNode.ResourceVersion = ""
				_, err = s.c.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{})
			} else if err == nil {
				csiNode = csiNode.DeepCopy()
				csiNode.Spec.Drivers = append(csiNode.Spec.Drivers, entry)
				_, err = s.c.StorageV1().CSINodes().Update(ctx, csiNode, metav1.UpdateOptions{})
			}
			if err == nil {
				break
			}
			if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
				s.t.Fatal(err)
			}
		}
	}
}

// watch records the PVs of the side's driver as they are created.
func (s *diffSide) watch() {
	ctx := s.t.Context()
	list, err := s.c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	w, err := s.c.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pv, ok := ev.Object.(*corev1.PersistentVolume)
			if !ok || ev.Type != watch.Added || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != s.driver.name || pv.Spec.ClaimRef == nil {
				continue
			}
			s.mu.Lock()
			s.pvs[pv.Spec.ClaimRef.Name] = pv
			s.mu.Unlock()
		}
	}()
	s.t.Cleanup(func() { w.Stop(); <-done })
}

// create creates the group's objects and claims.
func (s *diffSide) create() {
	ctx := s.t.Context()
	if err := s.setUp(); err != nil {
		s.t.Fatal(err)
	}
	// Claims that must not be provisioned first, then the others.
	for _, first := range []bool{true, false} {
		for _, c := range s.group.cases {
			if c.noCreate != first {
				continue
			}
			sc := testutil.NewSC(s.ns+"-"+c.name, s.driver.name).Obj()
			sc.UID, sc.ResourceVersion = "", ""
			if c.class != nil {
				c.class(sc)
			}
			if _, err := s.c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
				s.t.Fatal(err)
			}
			// kube-controller-manager's binder names the provisioner on
			// the claim; upstream waits for that, this sidecar's binder
			// does it.
			b := testutil.NewPVC(s.ns, c.name).Class(sc.Name).RV("").
				Annotation("volume.kubernetes.io/storage-provisioner", s.driver.name).
				Annotation("volume.beta.kubernetes.io/storage-provisioner", s.driver.name)
			if c.claim != nil {
				c.claim(b)
			}
			if c.vac {
				b.VolumeAttributesClass(s.ns + "-gold")
			}
			claim, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, b.Obj(), metav1.CreateOptions{})
			if err != nil {
				s.t.Fatal(err)
			}
			s.claims[c.name] = claim
			s.replace = append(s.replace, [2]string{string(claim.UID), "UID-" + c.name})
			if n := s.group.uuidLength; n > 0 {
				s.replace = append(s.replace, [2]string{strings.ReplaceAll(string(claim.UID), "-", "")[:n], "SHORTUID-" + c.name})
			}
		}
	}
	s.replace = append(s.replace, [2]string{s.ns, "NS"})
}

// wait waits until every claim that should be provisioned has its PV,
// then checks that the others got no CreateVolume.
func (s *diffSide) wait() {
	testutil.Eventually(s.t, 30*time.Second, s.ns+": not every claim has its PV", func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.group.cases {
			if !c.noCreate && !c.fails && s.pvs[c.name] == nil {
				return false, nil
			}
		}
		return true, nil
	})
	for _, c := range s.group.cases {
		if !c.noCreate {
			continue
		}
		if req := s.driver.get(s.claims[c.name].UID, s.group.uuidLength); req != nil {
			s.t.Errorf("%s: %s sent CreateVolume for a claim that is not its to provision: %v", s.ns, c.name, req)
		}
	}
}

// setUp creates what the data source cases need: a Bound claim "src" of
// the clone case's class with a static PV, the secrets the secrets case
// names, a ready VolumeSnapshot "snap" and a VolumeAttributesClass.
func (s *diffSide) setUp() error {
	ctx := s.t.Context()
	for _, name := range []string{"secrets-creds", "annotated"} {
		if _, err := s.c.CoreV1().Secrets(s.ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			StringData: map[string]string{"user": "u", "token": "t"},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	if _, err := e2e.CreateReadySnapshot(ctx, s.snaps, s.ns, "snap", s.driver.name, "snap-handle", 1<<30); err != nil {
		return err
	}
	if _, err := s.c.StorageV1().VolumeAttributesClasses().Create(ctx, &storagev1.VolumeAttributesClass{
		ObjectMeta: metav1.ObjectMeta{Name: s.ns + "-gold"},
		DriverName: s.driver.name,
		Parameters: map[string]string{"iops": "3000", "tier": "gold"},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The source of clones: of the class of the case "clone".
	class := s.ns + "-clone"
	src, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, testutil.NewPVC(s.ns, "src").Class(class).VolumeName(s.ns+"-src").RV("").Obj(), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	pv := testutil.NewPV(s.ns+"-src", s.driver.name).Class(class).Size("1Gi").RV("").
		ClaimRef(s.ns, "src", string(src.UID)).Obj()
	pv.UID = ""
	pv.Spec.CSI.VolumeHandle = "src-vol"
	pv.Status = corev1.PersistentVolumeStatus{}
	pv, err = s.c.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	pv.Status.Phase = corev1.VolumeBound
	if _, err := s.c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return err
	}
	// Play the binder: this sidecar's would, upstream has none here.
	src.Status = corev1.PersistentVolumeClaimStatus{
		Phase: corev1.ClaimBound, AccessModes: src.Spec.AccessModes,
		Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
	}
	if _, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).UpdateStatus(ctx, src, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// cleanup deletes the claims, PVs and cluster-scoped objects the side
// created; the driver keeps nothing. The claims go first, finalizers and
// all: the control plane runs no namespace controller, and a claim left
// behind with its class deleted gets a Warning from the binder of every
// sidecar that later tests start on the shared control plane.
func (s *diffSide) cleanup() {
	ctx := context.Background()
	if claims, err := s.c.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, c := range claims.Items {
			_, _ = s.c.CoreV1().PersistentVolumeClaims(s.ns).Patch(ctx, c.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			_ = s.c.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, c.Name, metav1.DeleteOptions{})
		}
	}
	s.mu.Lock()
	names := []string{s.ns + "-src"}
	for _, pv := range s.pvs {
		names = append(names, pv.Name)
	}
	s.mu.Unlock()
	for _, name := range names {
		_, _ = s.c.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		_ = s.c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	}
	for _, c := range s.group.cases {
		_ = s.c.StorageV1().StorageClasses().Delete(ctx, s.ns+"-"+c.name, metav1.DeleteOptions{})
	}
	_ = s.c.StorageV1().VolumeAttributesClasses().Delete(ctx, s.ns+"-gold", metav1.DeleteOptions{})
	_ = e2e.DeleteSnapshot(ctx, s.snaps, s.ns, "snap")
}

// identity is the provisioner identity both sidecars record in
// volumeAttributes: start time in milliseconds, a random number, the driver.
var identity = regexp.MustCompile(`[0-9]{10,}-[0-9]+-NS\.diff\.csi\.kube-storage\.io`)

// normalise replaces what differs between the sides by placeholders.
func (s *diffSide) normalise(text string) string {
	for _, r := range s.replace {
		text = strings.ReplaceAll(text, r[0], r[1])
	}
	return identity.ReplaceAllString(text, "IDENTITY")
}

// warnings waits for a Warning event on the case's claim and returns the
// distinct "reason: message" of its Warning events, normalised.
func (s *diffSide) warnings(name string) []string {
	claim := s.claims[name]
	var out []string
	testutil.Eventually(s.t, 30*time.Second, s.ns+": no Warning event on claim "+name, func(ctx context.Context) (bool, error) {
		list, err := s.c.CoreV1().Events(s.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(claim.UID)})
		if err != nil {
			return false, err
		}
		out = nil
		for _, e := range list.Items {
			if e.Type == corev1.EventTypeWarning {
				if w := s.normalise(e.Reason + ": " + e.Message); !slices.Contains(out, w) {
					out = append(out, w)
				}
			}
		}
		return len(out) > 0, nil
	})
	slices.Sort(out)
	return out
}

// request returns the normalised CreateVolumeRequest of the case's claim,
// the values of its secrets dropped.
func (s *diffSide) request(name string) *csi.CreateVolumeRequest {
	claim := s.claims[name]
	if claim == nil {
		return nil
	}
	req := s.driver.get(claim.UID, s.group.uuidLength)
	if req == nil {
		return nil
	}
	for k := range req.Secrets {
		req.Secrets[k] = "VALUE"
	}
	b, err := protojson.Marshal(req)
	if err != nil {
		s.t.Fatal(err)
	}
	out := &csi.CreateVolumeRequest{}
	if err := protojson.Unmarshal([]byte(s.normalise(string(b))), out); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// pv returns the normalised PV of the case's claim, as created, as JSON
// lines (fields in a fixed order) for a readable diff.
func (s *diffSide) pv(name string) []string {
	s.mu.Lock()
	pv := s.pvs[name]
	s.mu.Unlock()
	if pv == nil {
		return nil
	}
	pv = pv.DeepCopy()
	pv.UID, pv.ResourceVersion, pv.CreationTimestamp, pv.ManagedFields, pv.Generation = "", "", metav1.Time{}, nil, 0
	pv.Status.LastPhaseTransitionTime = nil
	// Upstream lists a term's expressions in Go's random map order (of
	// the driver's topology segments), this sidecar by key (README).
	if aff := pv.Spec.NodeAffinity; aff != nil && aff.Required != nil {
		for _, term := range aff.Required.NodeSelectorTerms {
			slices.SortFunc(term.MatchExpressions, func(a, b corev1.NodeSelectorRequirement) int { return strings.Compare(a.Key, b.Key) })
		}
	}
	if ref := pv.Spec.ClaimRef; ref != nil && ref.ResourceVersion != "" {
		ref.ResourceVersion = "RV"
	}
	b, err := json.MarshalIndent(pv, "", " ")
	if err != nil {
		s.t.Fatal(err)
	}
	return strings.Split(s.normalise(string(b)), "\n")
}

// recordingDriver records the first CreateVolumeRequest of each volume name
// (and whether a later one differed) and answers it with a
// volume named after the request, of the required size, in the first
// preferred (else requisite) topology, with the content source asked,
// unless the request's parameters script a failure (see paramFailCode). It
// records each DeleteVolumeRequest too, and answers it OK unless a
// deleteScript of the volume says otherwise. With capacity, it reports
// GET_CAPACITY and answers GetCapacity (differential_capacity_test.go).
type recordingDriver struct {
	controllerDriver
	publish    bool
	capacity   bool
	mu         sync.Mutex
	requests   map[string]*csi.CreateVolumeRequest
	deletes    []*csi.DeleteVolumeRequest
	deleteErrs map[string]*deleteScript
	// creates counts the CreateVolume calls by volume name; changed
	// names the volumes whose request differed from the first one.
	creates map[string]int
	changed map[string]bool
	// capacityReqs are the GetCapacityRequests received; capacityFailing
	// turns on the failures that classes script (paramCapacityFailZone).
	capacityReqs    []*csi.GetCapacityRequest
	capacityFailing bool
}

// Class parameters that script CreateVolume: the first fail-times calls
// of a volume fail with the gRPC code fail-code (a name such as
// "INVALID_ARGUMENT"), or get the answer fail-answer instead: "small" (half
// the required size) or "noid" (a volume without volume_id). Later calls
// succeed.
const (
	paramFailCode   = "fail-code"
	paramFailTimes  = "fail-times"
	paramFailAnswer = "fail-answer"
)

// deleteScript makes DeleteVolume of one volume fail with err, times
// times (for ever if times is negative).
type deleteScript struct {
	err   error
	times int
}

// failDelete makes DeleteVolume of volume id fail with err, times times
// (negative: until failDelete is called again with times 0).
func (d *recordingDriver) failDelete(id string, err error, times int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if times == 0 {
		delete(d.deleteErrs, id)
		return
	}
	d.deleteErrs[id] = &deleteScript{err: err, times: times}
}

// deleteRequests returns copies of the DeleteVolumeRequests received for
// volume id, in order.
func (d *recordingDriver) deleteRequests(id string) []*csi.DeleteVolumeRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*csi.DeleteVolumeRequest
	for _, req := range d.deletes {
		if req.GetVolumeId() == id {
			out = append(out, proto.Clone(req).(*csi.DeleteVolumeRequest))
		}
	}
	return out
}

func (d *recordingDriver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	caps := createDeleteCapabilities()
	for _, c := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	} {
		caps.Capabilities = append(caps.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	for _, c := range []struct {
		on  bool
		rpc csi.ControllerServiceCapability_RPC_Type
	}{
		{d.publish, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME},
		{d.capacity, csi.ControllerServiceCapability_RPC_GET_CAPACITY},
	} {
		if c.on {
			caps.Capabilities = append(caps.Capabilities, &csi.ControllerServiceCapability{
				Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c.rpc}},
			})
		}
	}
	return caps, nil
}

func (d *recordingDriver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d.mu.Lock()
	if first := d.requests[req.GetName()]; first != nil && !proto.Equal(first, req) {
		if d.changed == nil {
			d.changed = map[string]bool{}
		}
		d.changed[req.GetName()] = true
	} else if first == nil {
		d.requests[req.GetName()] = proto.Clone(req).(*csi.CreateVolumeRequest)
	}
	if d.creates == nil {
		d.creates = map[string]int{}
	}
	d.creates[req.GetName()]++
	call := d.creates[req.GetName()]
	d.mu.Unlock()
	size := req.GetCapacityRange().GetRequiredBytes()
	if size == 0 {
		size = 1 << 30
	}
	answer := ""
	if times, err := strconv.Atoi(req.GetParameters()[paramFailTimes]); err == nil && call <= times {
		if name := req.GetParameters()[paramFailCode]; name != "" {
			var code codes.Code
			if err := code.UnmarshalJSON([]byte(strconv.Quote(name))); err != nil {
				return nil, status.Errorf(codes.Internal, "test script: %v", err)
			}
			return nil, status.Errorf(code, "scripted failure %d", call)
		}
		answer = req.GetParameters()[paramFailAnswer]
	}
	if answer == "small" {
		size /= 2
	}
	vol := &csi.Volume{
		VolumeId: "id-" + req.GetName(), CapacityBytes: size, VolumeContext: map[string]string{"answer": "yes"},
		ContentSource: req.GetVolumeContentSource(),
	}
	if top := firstTopology(req); top != nil {
		vol.AccessibleTopology = []*csi.Topology{top}
	}
	if answer == "noid" {
		vol.VolumeId = ""
	}
	return &csi.CreateVolumeResponse{Volume: vol}, nil
}

func (d *recordingDriver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.deletes = append(d.deletes, proto.Clone(req).(*csi.DeleteVolumeRequest))
	if script := d.deleteErrs[req.GetVolumeId()]; script != nil {
		if script.times > 0 {
			script.times--
			if script.times == 0 {
				delete(d.deleteErrs, req.GetVolumeId())
			}
		}
		return nil, script.err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// firstTopology is the segment of the volume the recording driver
// creates for req: the first preferred, else the first requisite one, nil
// without either.
func firstTopology(req *csi.CreateVolumeRequest) *csi.Topology {
	top := req.GetAccessibilityRequirements()
	if p := top.GetPreferred(); len(p) > 0 {
		return p[0]
	}
	if r := top.GetRequisite(); len(r) > 0 {
		return r[0]
	}
	return nil
}

// get returns a copy of the request whose name carries uid (cut to
// uuidLength characters if that is positive), nil if none.
func (d *recordingDriver) get(uid types.UID, uuidLength int) *csi.CreateVolumeRequest {
	id := string(uid)
	if uuidLength > 0 {
		// As upstream cuts it: without its dashes.
		id = strings.ReplaceAll(id, "-", "")[:uuidLength]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, req := range d.requests {
		if strings.HasSuffix(name, id) {
			return proto.Clone(req).(*csi.CreateVolumeRequest)
		}
	}
	return nil
}
