package csiclient

import (
	"maps"
	"testing"
)

func TestDriverParameters(t *testing.T) {
	tests := []struct {
		name   string
		params map[string]string
		want   map[string]string
	}{
		{name: "none", params: nil, want: nil},
		{name: "only the driver's", params: map[string]string{"kind": "fast", "fstype": "ext4"}, want: map[string]string{"kind": "fast", "fstype": "ext4"}},
		{
			name: "reserved keys dropped, deprecated unprefixed ones kept",
			params: map[string]string{
				"kind": "fast", "csi.storage.k8s.io/fstype": "xfs", "csi.storage.k8s.io/provisioner-secret-name": "s",
				"csi.storage.k8s.io/unknown": "x", "example.com/csi.storage.k8s.io/": "kept",
			},
			want: map[string]string{"kind": "fast", "example.com/csi.storage.k8s.io/": "kept"},
		},
		{name: "only reserved keys", params: map[string]string{"csi.storage.k8s.io/fstype": "xfs"}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := maps.Clone(tt.params)
			got := DriverParameters(tt.params)
			if !maps.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Errorf("DriverParameters(%v) = %v, want %v", tt.params, got, tt.want)
			}
			if !maps.Equal(in, tt.params) {
				t.Errorf("DriverParameters changed its argument to %v", tt.params)
			}
		})
	}
}
