// Package cachetrim shrinks objects before they enter the sidecar's shared
// informer cache: it drops what the sidecar never reads (managedFields, most
// of a Pod) and lets equal parts of different objects share one copy.
//
// Thousands of claims and volumes of one driver mostly carry the same
// annotations, finalizers, access modes, capacities and volume attributes;
// decoded, each carries its own maps and strings, and a one-entry
// ResourceList alone costs about 700 bytes. A [Trimmer] keeps one canonical
// copy of each such value and points every object at it.
//
// Contract: objects that went through a Trimmer are read-only, which is
// client-go's rule for the informer cache anyway. Sharing raises the stakes
// of breaking it: writing into one claim's annotations would change every
// claim that shares the map. Writers DeepCopy first; DeepCopy allocates new
// maps and slices, so a copy owns all of its memory and may be changed and
// sent in an Update. `make test` runs the sidecar with client-go's cache
// mutation detector (KUBE_CACHE_MUTATION_DETECTOR=true) to hold our code,
// and the provisioning library, to that rule; the detector compares every
// cached object with a private copy once a second and panics on a change.
package cachetrim

import (
	"encoding/binary"
	"iter"
	"maps"
	"slices"
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// maxShared bounds each table of canonical values. A full table is
	// cleared, which only ends sharing with the objects decoded before.
	maxShared = 1024
	// maxKeyBytes keeps large, usually unique values (such as
	// last-applied-configuration) out of the tables.
	maxKeyBytes = 512
)

// Trimmer is a client-go TransformFunc (see [Trimmer.Transform]) that
// shrinks claims, volumes and pods. It is safe for concurrent use; create
// one per informer factory with [New].
type Trimmer struct {
	mu sync.Mutex
	// key and names are scratch buffers for the encoding of one value,
	// reused under mu so that trimming allocates only what it keeps.
	key         []byte
	names       []string
	stringMaps  table[map[string]string]
	stringLists table[[]string]
	resources   table[corev1.ResourceList]
	modes       table[[]corev1.PersistentVolumeAccessMode]
	classNames  table[*string]
	texts       table[string]
}

// New returns a Trimmer with empty tables.
func New() *Trimmer {
	return &Trimmer{
		stringMaps:  newTable[map[string]string](),
		stringLists: newTable[[]string](),
		resources:   newTable[corev1.ResourceList](),
		modes:       newTable[[]corev1.PersistentVolumeAccessMode](),
		classNames:  newTable[*string](),
		texts:       newTable[string](),
	}
}

// Transform trims obj in place and returns it. It is idempotent and never
// fails; objects it does not know keep everything but managedFields.
// Client-go calls it once per object decoded from a list or watch, before
// the object is visible to anyone else.
func (t *Trimmer) Transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		t.mu.Lock()
		t.claim(o)
		t.mu.Unlock()
		return o, nil
	case *corev1.PersistentVolume:
		t.mu.Lock()
		t.volume(o)
		t.mu.Unlock()
		return o, nil
	case *corev1.Pod:
		return trimPod(o), nil
	}
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func (t *Trimmer) meta(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	m.Namespace = str(m.Namespace)
	m.Labels = t.stringMap(m.Labels)
	m.Annotations = t.stringMap(m.Annotations)
	m.Finalizers = t.stringList(m.Finalizers)
}

func (t *Trimmer) claim(c *corev1.PersistentVolumeClaim) {
	t.meta(&c.ObjectMeta)
	s := &c.Spec
	s.AccessModes = t.accessModes(s.AccessModes)
	s.Resources.Requests = t.resourceList(s.Resources.Requests)
	s.Resources.Limits = t.resourceList(s.Resources.Limits)
	s.StorageClassName = t.className(s.StorageClassName)
	if s.VolumeMode != nil {
		s.VolumeMode = volumeMode(*s.VolumeMode)
	}
	st := &c.Status
	st.Phase = corev1.PersistentVolumeClaimPhase(str(string(st.Phase)))
	st.AccessModes = t.accessModes(st.AccessModes)
	st.Capacity = t.resourceList(st.Capacity)
	st.AllocatedResources = t.resourceList(st.AllocatedResources)
	// Kube-controller-manager (1.37) keeps an Unused condition on every
	// bound claim, with the same reason and message on all of them.
	for i := range st.Conditions {
		c := &st.Conditions[i]
		c.Type = corev1.PersistentVolumeClaimConditionType(str(string(c.Type)))
		c.Status = corev1.ConditionStatus(str(string(c.Status)))
		c.Reason, c.Message = t.text(c.Reason), t.text(c.Message)
	}
}

func (t *Trimmer) volume(v *corev1.PersistentVolume) {
	t.meta(&v.ObjectMeta)
	s := &v.Spec
	s.Capacity = t.resourceList(s.Capacity)
	s.AccessModes = t.accessModes(s.AccessModes)
	s.StorageClassName = str(s.StorageClassName)
	s.MountOptions = t.stringList(s.MountOptions)
	s.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(str(string(s.PersistentVolumeReclaimPolicy)))
	if s.VolumeMode != nil {
		s.VolumeMode = volumeMode(*s.VolumeMode)
	}
	if r := s.ClaimRef; r != nil {
		r.Kind, r.APIVersion, r.Namespace = str(r.Kind), str(r.APIVersion), str(r.Namespace)
	}
	if csi := s.CSI; csi != nil {
		csi.Driver, csi.FSType = str(csi.Driver), str(csi.FSType)
		csi.VolumeAttributes = t.stringMap(csi.VolumeAttributes)
	}
	v.Status.Phase = corev1.PersistentVolumePhase(str(string(v.Status.Phase)))
}

// str returns the canonical copy of s, for strings that take few distinct
// values across objects (namespaces, driver names, phases). The unique
// package drops a canonical string once no object refers to it.
func str(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

var (
	filesystemMode = corev1.PersistentVolumeFilesystem
	blockMode      = corev1.PersistentVolumeBlock
)

// volumeMode returns a shared pointer for the two modes the API allows.
func volumeMode(m corev1.PersistentVolumeMode) *corev1.PersistentVolumeMode {
	switch m {
	case corev1.PersistentVolumeFilesystem:
		return &filesystemMode
	case corev1.PersistentVolumeBlock:
		return &blockMode
	}
	return &m
}

func (t *Trimmer) stringMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	t.names = sortedNames(t.names, maps.Keys(m))
	t.key = t.key[:0]
	for _, k := range t.names {
		t.key = appendField(t.key, k)
		t.key = appendField(t.key, m[k])
	}
	return t.stringMaps.share(t.key, m)
}

func (t *Trimmer) stringList(l []string) []string {
	if len(l) == 0 {
		return l
	}
	t.key = t.key[:0]
	for _, s := range l {
		t.key = appendField(t.key, s)
	}
	// A shared slice must not have spare capacity: an append to it would
	// write into the array every object shares.
	return t.stringLists.share(t.key, slices.Clip(l))
}

func (t *Trimmer) accessModes(l []corev1.PersistentVolumeAccessMode) []corev1.PersistentVolumeAccessMode {
	if len(l) == 0 {
		return l
	}
	t.key = t.key[:0]
	for _, s := range l {
		t.key = appendField(t.key, string(s))
	}
	return t.modes.share(t.key, slices.Clip(l))
}

func (t *Trimmer) resourceList(l corev1.ResourceList) corev1.ResourceList {
	if len(l) == 0 {
		return l
	}
	t.names = sortedNames(t.names, maps.Keys(l))
	t.key = t.key[:0]
	for _, n := range t.names {
		// A decoded quantity is canonical, so equal strings encode equally.
		q := l[corev1.ResourceName(n)]
		t.key = appendField(t.key, n)
		t.key = appendField(t.key, q.String())
	}
	return t.resources.share(t.key, l)
}

func (t *Trimmer) className(p *string) *string {
	if p == nil {
		return nil
	}
	t.key = appendField(t.key[:0], *p)
	return t.classNames.share(t.key, p)
}

// text shares a free-form string, such as a condition's reason or message,
// through a bounded table: unlike [str], a controller may make each one
// different.
func (t *Trimmer) text(s string) string {
	if s == "" {
		return s
	}
	t.key = appendField(t.key[:0], s)
	return t.texts.share(t.key, s)
}

// sortedNames returns keys sorted, reusing buf.
func sortedNames[K ~string](buf []string, keys iter.Seq[K]) []string {
	buf = buf[:0]
	for k := range keys {
		buf = append(buf, string(k))
	}
	slices.Sort(buf)
	return buf
}

// appendField appends s with its length in front, so that no two different
// sequences of fields encode alike, whatever bytes the values hold.
func appendField(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// table holds canonical values by their encoding.
type table[V any] struct {
	m map[string]V
}

func newTable[V any]() table[V] { return table[V]{m: make(map[string]V)} }

// share returns the canonical value for key, making v canonical when there
// is none yet. Keys longer than maxKeyBytes are not shared.
func (t *table[V]) share(key []byte, v V) V {
	if len(key) > maxKeyBytes {
		return v
	}
	if c, ok := t.m[string(key)]; ok {
		return c
	}
	if len(t.m) >= maxShared {
		clear(t.m)
	}
	t.m[string(key)] = v
	return v
}
