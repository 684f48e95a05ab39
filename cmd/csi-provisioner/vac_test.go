package main

import (
	"context"
	"errors"
	"io"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes/fake"
)

// failingDiscovery fails every group version lookup.
type failingDiscovery struct {
	discovery.ServerResourcesInterfaceWithContext
}

func (failingDiscovery) ServerResourcesForGroupVersionWithContext(context.Context, string) (*metav1.APIResourceList, error) {
	return nil, errors.New("connection refused")
}

// TestVolumeAttributesClassesServed: false only when the gate is on and the
// API server does not serve storage.k8s.io/v1 VolumeAttributesClasses; a
// discovery error, or the gate off, gives true (nothing to refuse).
func TestVolumeAttributesClassesServed(t *testing.T) {
	storageV1 := func(resources ...string) []*metav1.APIResourceList {
		return apiResources("storage.k8s.io/v1", resources...)
	}
	tests := []struct {
		name      string
		args      []string
		resources []*metav1.APIResourceList
		failing   bool
		want      bool
	}{
		{name: "served", resources: storageV1("storageclasses", "volumeattributesclasses"), want: true},
		{name: "v1 without the classes (v1.31 to v1.33)", resources: storageV1("storageclasses", "csidrivers")},
		{name: "no storage.k8s.io/v1"},
		{name: "set on while not served", args: []string{"--feature-gates=VolumeAttributesClass=true"}, resources: storageV1("storageclasses")},
		{name: "gate off", args: []string{"--feature-gates=VolumeAttributesClass=false"}, resources: storageV1("storageclasses"), want: true},
		{name: "discovery fails", failing: true, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseFlags(append([]string{"--csi-address=/tmp/csi.sock"}, tt.args...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			client := fake.NewClientset()
			client.Resources = tt.resources
			var disc discovery.ServerResourcesInterfaceWithContext = client.Discovery()
			if tt.failing {
				disc = failingDiscovery{}
			}
			if got := volumeAttributesClassesServed(t.Context(), cfg.FeatureGates, disc); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
