package cachetrim

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzTransform trims two claims and two volumes built from the same
// fuzzed values (the second of each with one differing annotation), so
// that they share canonical values. Invariants: trimming changes nothing
// but managedFields (semantically: a quantity may be the canonical copy of
// an equal one); and after a DeepCopy of one object is changed in every
// field the trimmer shares, the other objects are unchanged.
func FuzzTransform(f *testing.F) {
	f.Add("k", "v", "kubernetes.io/pvc-protection", "1Gi", "ReadWriteOnce", "fast", "ns", "csi.example.com", "ext4")
	f.Add("", "", "", "1000m", "", "", "", "", "")
	f.Add("a", "b", "f", "1.5Gi", "ReadWriteOncePod", "", "default", "d", "")
	f.Fuzz(func(t *testing.T, key, value, finalizer, size, mode, class, namespace, driver, fsType string) {
		q, err := resource.ParseQuantity(size)
		if err != nil {
			q = resource.MustParse("1")
		}
		meta := func(name, extra string) metav1.ObjectMeta {
			return metav1.ObjectMeta{
				Name: name, Namespace: namespace,
				Labels:        map[string]string{key: value},
				Annotations:   map[string]string{key: value, "extra": extra},
				Finalizers:    []string{finalizer, finalizer + "x"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}},
			}
		}
		claim := func(name, extra string) *corev1.PersistentVolumeClaim {
			c := &corev1.PersistentVolumeClaim{ObjectMeta: meta(name, extra)}
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.PersistentVolumeAccessMode(mode)}
			c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: q}
			c.Spec.StorageClassName = &class
			c.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: q}
			c.Status.Conditions = []corev1.PersistentVolumeClaimCondition{{Type: "Unused", Reason: value, Message: key}}
			return c
		}
		volume := func(name, extra string) *corev1.PersistentVolume {
			v := &corev1.PersistentVolume{ObjectMeta: meta(name, extra)}
			v.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: q}
			v.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.PersistentVolumeAccessMode(mode)}
			v.Spec.MountOptions = []string{value}
			v.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: driver, FSType: fsType, VolumeAttributes: map[string]string{key: value}}
			v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: namespace, Name: name}
			return v
		}
		objs := []any{claim("a", "1"), claim("b", "2"), volume("a", "1"), volume("b", "2")}
		want := make([]any, len(objs))
		trimmer := New()
		for i, o := range objs {
			switch o := o.(type) {
			case *corev1.PersistentVolumeClaim:
				w := o.DeepCopy()
				w.ManagedFields = nil
				want[i] = w
			case *corev1.PersistentVolume:
				w := o.DeepCopy()
				w.ManagedFields = nil
				want[i] = w
			}
			got, err := trimmer.Transform(o)
			if err != nil {
				t.Fatal(err)
			}
			if !apiequality.Semantic.DeepEqual(got, want[i]) {
				t.Fatalf("object %d changed by trimming:\n%#v\nwant\n%#v", i, got, want[i])
			}
		}
		// A writer copies object 0 of each kind and changes everything.
		c := objs[0].(*corev1.PersistentVolumeClaim).DeepCopy()
		c.Labels[key] += "x"
		c.Annotations[key] += "x"
		c.Finalizers[0] += "x"
		c.Spec.AccessModes[0] += "x"
		c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("7")
		*c.Spec.StorageClassName += "x"
		c.Status.Capacity[corev1.ResourceStorage] = resource.MustParse("7")
		c.Status.Conditions[0].Reason += "x"
		v := objs[2].(*corev1.PersistentVolume).DeepCopy()
		v.Labels[key] += "x"
		v.Annotations[key] += "x"
		v.Finalizers[0] += "x"
		v.Spec.AccessModes[0] += "x"
		v.Spec.Capacity[corev1.ResourceStorage] = resource.MustParse("7")
		v.Spec.MountOptions[0] += "x"
		v.Spec.CSI.VolumeAttributes[key] += "x"
		for i := 1; i < len(objs); i++ {
			if i == 2 {
				continue
			}
			if !apiequality.Semantic.DeepEqual(objs[i], want[i]) {
				t.Fatalf("object %d changed by a write to a copy of another:\n%#v\nwant\n%#v", i, objs[i], want[i])
			}
		}
		if !apiequality.Semantic.DeepEqual(objs[0], want[0]) || !apiequality.Semantic.DeepEqual(objs[2], want[2]) {
			t.Fatal("a write to a copy changed the cached object")
		}
	})
}
