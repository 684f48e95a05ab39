package inflight

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestAddRemove(t *testing.T) {
	tests := []struct {
		name       string
		finalizers []string
		add        bool
		annotated  string // AnnVolumeName before
		volumeName string // Add's argument
		wantChange bool
		want       []string
		wantName   string // AnnVolumeName after
	}{
		{name: "add to none", add: true, wantChange: true, want: []string{Finalizer}},
		{name: "add keeps others", finalizers: []string{"kubernetes.io/pvc-protection"}, add: true, wantChange: true, want: []string{"kubernetes.io/pvc-protection", Finalizer}},
		{name: "add twice is no change", finalizers: []string{Finalizer}, add: true, want: []string{Finalizer}},
		{name: "add records the volume name", add: true, volumeName: "pvc-1", wantChange: true, want: []string{Finalizer}, wantName: "pvc-1"},
		{name: "add keeps a recorded name equal", annotated: "pvc-1", add: true, volumeName: "pvc-1", wantChange: true, want: []string{Finalizer}, wantName: "pvc-1"},
		{name: "add replaces a recorded name", annotated: "old-1", add: true, volumeName: "pvc-1", wantChange: true, want: []string{Finalizer}, wantName: "pvc-1"},
		{name: "name recorded on a claim that has the finalizer", finalizers: []string{Finalizer}, add: true, volumeName: "pvc-1", wantChange: true, want: []string{Finalizer}, wantName: "pvc-1"},
		{name: "nothing to do", finalizers: []string{Finalizer}, annotated: "pvc-1", add: true, volumeName: "pvc-1", want: []string{Finalizer}, wantName: "pvc-1"},
		{name: "no name, none recorded", add: true, wantChange: true, want: []string{Finalizer}},
		{name: "remove drops the recorded name", finalizers: []string{Finalizer}, annotated: "pvc-1", wantChange: true},
		{name: "remove absent leaves the name", annotated: "pvc-1", wantName: "pvc-1"},
		{name: "remove last gives nil", finalizers: []string{Finalizer}, wantChange: true},
		{name: "remove keeps others", finalizers: []string{"a", Finalizer, "b"}, wantChange: true, want: []string{"a", "b"}},
		{name: "remove absent is no change", finalizers: []string{"a"}, want: []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := slices.Clone(tt.finalizers)
			claim := &corev1.PersistentVolumeClaim{}
			claim.Finalizers = tt.finalizers
			if tt.annotated != "" {
				claim.Annotations = map[string]string{AnnVolumeName: tt.annotated}
			}
			var changed bool
			if tt.add {
				changed = Add(claim, tt.volumeName)
			} else {
				changed = Remove(claim)
			}
			if changed != tt.wantChange {
				t.Errorf("changed = %v, want %v", changed, tt.wantChange)
			}
			if !slices.Equal(claim.Finalizers, tt.want) {
				t.Errorf("finalizers = %v, want %v", claim.Finalizers, tt.want)
			}
			if !tt.add && !slices.Equal(tt.finalizers, orig) {
				t.Errorf("Remove modified the caller's slice: %v", tt.finalizers)
			}
			if got := claim.Annotations[AnnVolumeName]; got != tt.wantName {
				t.Errorf("%s = %q, want %q", AnnVolumeName, got, tt.wantName)
			}
			if Has(claim) != slices.Contains(tt.want, Finalizer) {
				t.Errorf("Has = %v after the change", Has(claim))
			}
		})
	}
}
