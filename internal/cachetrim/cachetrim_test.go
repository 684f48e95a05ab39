package cachetrim

import (
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// protoObject is an API object pointer with its generated protobuf methods.
type protoObject[T any] interface {
	*T
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// decoded returns obj as the API client hands it to the informer: decoded
// from protobuf, so that it owns all its maps, slices and strings.
func decoded[T any, P protoObject[T]](t testing.TB, obj P) P {
	t.Helper()
	b, err := obj.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out := P(new(T))
	if err := out.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	return out
}

func fresh(t testing.TB, c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	return decoded(t, c)
}

func freshPV(t testing.TB, v *corev1.PersistentVolume) *corev1.PersistentVolume {
	return decoded(t, v)
}

func boundClaim(name string) *testutil.PVCBuilder {
	return testutil.NewPVC("ns", name).UID("uid-"+name).Class("fast").Size("1Gi").
		AccessModes(corev1.ReadWriteOnce).VolumeName("pv-"+name).
		Annotation("pv.kubernetes.io/bind-completed", "yes").
		Annotation("volume.kubernetes.io/storage-provisioner", "hostpath.csi.kube-storage.io").
		Finalizers("kubernetes.io/pvc-protection").
		Phase(corev1.ClaimBound)
}

func boundVolume(name string) *corev1.PersistentVolume {
	v := testutil.NewPV("pv-"+name, "hostpath.csi.kube-storage.io").Class("fast").Size("1Gi").
		AccessModes(corev1.ReadWriteOnce).ClaimRef("ns", name, "uid-"+name).
		Annotation("pv.kubernetes.io/provisioned-by", "hostpath.csi.kube-storage.io").
		Finalizers("kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer").Obj()
	v.Spec.CSI.VolumeAttributes = map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "1763-hostpath"}
	return v
}

// realPair returns copy i of the bound claim and volume in testdata, real
// objects of kube-apiserver v1.37.2 (managedFields included), with names and
// UIDs of their own, decoded from protobuf.
func realPair(t testing.TB, i int) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	t.Helper()
	var c corev1.PersistentVolumeClaim
	var v corev1.PersistentVolume
	for file, obj := range map[string]any{"testdata/bound-claim.yaml": &c, "testdata/bound-volume.yaml": &v} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(data, obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	uid := types.UID(fmt.Sprintf("b0c5b392-10f8-4842-9340-%012d", i))
	c.Name, c.UID, c.Spec.VolumeName = fmt.Sprintf("claim-%05d", i), uid, "pvc-"+string(uid)
	v.Name, v.UID = c.Spec.VolumeName, types.UID(fmt.Sprintf("80200f4d-fc24-4683-acf8-%012d", i))
	v.Spec.ClaimRef.Name, v.Spec.ClaimRef.UID = c.Name, uid
	v.Spec.CSI.VolumeHandle = fmt.Sprintf("vol-%016x", i)
	return decoded(t, &c), decoded(t, &v)
}

// same reports whether a and b are the same map or the same slice array.
func same(a, b any) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func TestTransformKeepsContent(t *testing.T) {
	tr := New()
	for _, c := range []*corev1.PersistentVolumeClaim{
		boundClaim("a").Obj(),
		boundClaim("b").Size("2Gi").Block().Label("app", "db").Obj(),
		testutil.NewPVC("other", "pending").Obj(),
	} {
		obj := fresh(t, c)
		obj.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		want := fresh(t, c)
		got, err := tr.Transform(obj)
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("claim %s changed:\n got %+v\nwant %+v", c.Name, got, want)
		}
	}
	for _, name := range []string{"a", "b"} {
		v := boundVolume(name)
		got, err := tr.Transform(freshPV(t, v))
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(got, freshPV(t, v)) {
			t.Errorf("volume %s changed:\n got %+v\nwant %+v", name, got, v)
		}
	}
	c, v := realPair(t, 0)
	wantC, wantV := c.DeepCopy(), v.DeepCopy()
	wantC.ManagedFields, wantV.ManagedFields = nil, nil
	if got, _ := tr.Transform(c); !equality.Semantic.DeepEqual(got, wantC) {
		t.Errorf("real claim changed:\n got %+v\nwant %+v", got, wantC)
	}
	if got, _ := tr.Transform(v); !equality.Semantic.DeepEqual(got, wantV) {
		t.Errorf("real volume changed:\n got %+v\nwant %+v", got, wantV)
	}
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "helm"}}}}
	if got, _ := tr.Transform(class); got.(*storagev1.StorageClass).ManagedFields != nil {
		t.Errorf("class keeps managedFields")
	}
}

func TestTransformShares(t *testing.T) {
	tr := New()
	trim := func(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
		got, _ := tr.Transform(fresh(t, c))
		return got.(*corev1.PersistentVolumeClaim)
	}
	a, b := trim(boundClaim("a").Obj()), trim(boundClaim("b").Obj())
	bigger := trim(boundClaim("c").Size("2Gi").Obj())

	for _, tc := range []struct {
		name  string
		x, y  any
		share bool
	}{
		{"annotations", a.Annotations, b.Annotations, true},
		{"finalizers", a.Finalizers, b.Finalizers, true},
		{"requests", a.Spec.Resources.Requests, b.Spec.Resources.Requests, true},
		{"status capacity", a.Status.Capacity, b.Status.Capacity, true},
		{"access modes", a.Spec.AccessModes, b.Spec.AccessModes, true},
		{"class name", a.Spec.StorageClassName, b.Spec.StorageClassName, true},
		{"different requests", a.Spec.Resources.Requests, bigger.Spec.Resources.Requests, false},
	} {
		if got := same(tc.x, tc.y); got != tc.share {
			t.Errorf("%s: shared %v, want %v", tc.name, got, tc.share)
		}
	}

	va, _ := tr.Transform(freshPV(t, boundVolume("a")))
	vb, _ := tr.Transform(freshPV(t, boundVolume("b")))
	pa, pb := va.(*corev1.PersistentVolume), vb.(*corev1.PersistentVolume)
	if !same(pa.Spec.Capacity, pb.Spec.Capacity) || !same(pa.Spec.CSI.VolumeAttributes, pb.Spec.CSI.VolumeAttributes) || !same(pa.Annotations, pb.Annotations) {
		t.Errorf("volumes with equal capacity, attributes and annotations do not share them")
	}

	ra, _ := realPair(t, 1)
	rb, _ := realPair(t, 2)
	for _, c := range []*corev1.PersistentVolumeClaim{ra, rb} {
		if _, err := tr.Transform(c); err != nil {
			t.Fatal(err)
		}
	}
	ca, cb := ra.Status.Conditions[0], rb.Status.Conditions[0]
	if !sameString(ca.Message, cb.Message) || !sameString(ca.Reason, cb.Reason) || !sameString(string(ca.Type), string(cb.Type)) {
		t.Errorf("the Unused conditions of two claims do not share their strings")
	}
}

func sameString(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

// TestCopiesOwnTheirMemory is the contract writers rely on: a DeepCopy of a
// trimmed object may be changed without touching any other object, and an
// append to a shared slice never writes into the shared array.
func TestCopiesOwnTheirMemory(t *testing.T) {
	tr := New()
	// Three finalizers and three access modes: decoded, each slice has
	// room for a fourth.
	claim := func(name string) *corev1.PersistentVolumeClaim {
		return fresh(t, boundClaim(name).Finalizers("x", "y").AccessModes(corev1.ReadWriteOnce, corev1.ReadOnlyMany, corev1.ReadWriteMany).Obj())
	}
	a, _ := tr.Transform(claim("a"))
	b, _ := tr.Transform(claim("b"))
	ca, cb := a.(*corev1.PersistentVolumeClaim), b.(*corev1.PersistentVolumeClaim)
	want := claim("b")
	if c := claim("c").Finalizers; cap(c) == len(c) {
		t.Fatal("the decoded slice has no spare capacity; the append below tests nothing")
	}
	if m := claim("c").Spec.AccessModes; cap(m) == len(m) {
		t.Fatal("the decoded access modes have no spare capacity; the append below tests nothing")
	}

	cp := ca.DeepCopy()
	cp.Annotations["changed"] = "yes"
	cp.Spec.Resources.Requests[corev1.ResourceStorage] = *resourceQuantity("5Gi")
	cp.Finalizers[0] = "changed"
	// Two writers each append to their own claim's finalizers: with a shared
	// array that had room, the second append would overwrite the first.
	fa := append(ca.Finalizers, "added-to-a")
	fb := append(cb.Finalizers, "added-to-b")
	if fa[len(fa)-1] != "added-to-a" || fb[len(fb)-1] != "added-to-b" {
		t.Errorf("appends to two claims' finalizers overwrote each other: %v, %v", fa, fb)
	}
	ma := append(ca.Spec.AccessModes, corev1.ReadWriteOncePod)
	mb := append(cb.Spec.AccessModes, "added-to-b")
	if ma[len(ma)-1] != corev1.ReadWriteOncePod || mb[len(mb)-1] != "added-to-b" {
		t.Errorf("appends to two claims' access modes overwrote each other: %v, %v", ma, mb)
	}

	if !equality.Semantic.DeepEqual(cb, want) {
		t.Errorf("changing a copy of one claim changed another:\n got %+v\nwant %+v", cb, want)
	}
}

func TestEncodingIsUnambiguous(t *testing.T) {
	tr := New()
	x := tr.stringMap(map[string]string{"ab": "c"})
	y := tr.stringMap(map[string]string{"a": "bc"})
	z := tr.stringMap(map[string]string{"a": "b", "c": ""})
	if same(x, y) || same(y, z) || same(x, z) {
		t.Errorf("different maps share one canonical copy: %v %v %v", x, y, z)
	}
	l1 := tr.stringList([]string{"a", "bc"})
	l2 := tr.stringList([]string{"ab", "c"})
	if same(l1, l2) {
		t.Errorf("different lists share: %v %v", l1, l2)
	}
}

func TestBounds(t *testing.T) {
	tr := New()
	big := strings.Repeat("x", maxKeyBytes)
	m1 := tr.stringMap(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": big})
	m2 := tr.stringMap(map[string]string{"kubectl.kubernetes.io/last-applied-configuration": big})
	if same(m1, m2) {
		t.Errorf("a map larger than %d bytes was shared", maxKeyBytes)
	}
	if n := len(tr.stringMaps.m); n != 0 {
		t.Errorf("the table holds %d large maps, want 0", n)
	}
	for i := range 3 * maxShared {
		m := map[string]string{"k": fmt.Sprint(i)}
		if got := tr.stringMap(m); got["k"] != fmt.Sprint(i) {
			t.Fatalf("map %d came back as %v", i, got)
		}
		if n := len(tr.stringMaps.m); n > maxShared {
			t.Fatalf("table grew to %d entries, bound %d", n, maxShared)
		}
	}
}

func TestTrimPod(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u", ResourceVersion: "7", Labels: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{
			NodeName:   "node-1",
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{}}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	got, _ := New().Transform(pod)
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u", ResourceVersion: "7"},
		Spec: corev1.PodSpec{
			NodeName: "node-1",
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}},
			},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("trimmed pod:\n got %+v\nwant %+v", got, want)
	}
}

// BenchmarkRetained reports the heap that 10,000 bound claims and their
// volumes keep (copies of the real pair in testdata), decoded as the
// informer receives them, with and without the Trimmer.
func BenchmarkRetained(b *testing.B) {
	const n = 10000
	var enc [][]byte
	for i := range n {
		c, v := realPair(b, i)
		cb, err := c.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		vb, err := v.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		enc = append(enc, cb, vb)
	}
	for _, trim := range []bool{false, true} {
		b.Run(fmt.Sprintf("trim=%v", trim), func(b *testing.B) {
			for b.Loop() {
				tr := New()
				keep := make([]any, 0, 2*n)
				before := heapInUse()
				for i := range n {
					pc, pv := new(corev1.PersistentVolumeClaim), new(corev1.PersistentVolume)
					if err := pc.Unmarshal(enc[2*i]); err != nil {
						b.Fatal(err)
					}
					if err := pv.Unmarshal(enc[2*i+1]); err != nil {
						b.Fatal(err)
					}
					var c, v any = pc, pv
					if trim {
						c, _ = tr.Transform(c)
						v, _ = tr.Transform(v)
					}
					keep = append(keep, c, v)
				}
				after := heapInUse()
				b.ReportMetric(float64(after-before)/n, "B/pair")
				runtime.KeepAlive(keep)
			}
		})
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func resourceQuantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}
