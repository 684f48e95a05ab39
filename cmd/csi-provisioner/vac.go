package main

import (
	"context"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
)

// volumeAttributesClassesServed reports whether the API server serves
// storage.k8s.io/v1 VolumeAttributesClasses, which the provisioner reads
// (v1.34 and later; before, v1beta1 at most). It asks only when the gate is
// on, and reports true when it is off or discovery fails.
//
// Upstream v6.3 turns its gate off instead, unless the gate was set on the
// command line. On a cluster that serves the beta API with its gate on, that
// creates a volume without the class's parameters that kube-controller-manager
// then refuses to bind to the claim (the class names differ), so the claim
// stays Pending with a volume. Here the gate stays on and such a claim is
// refused before anything is created, with a Warning that says why.
func volumeAttributesClassesServed(ctx context.Context, gates featuregate.FeatureGate, disc discovery.ServerResourcesInterfaceWithContext) bool {
	if !gates.Enabled(FeatureVolumeAttributesClass) {
		return true
	}
	logger := klog.FromContext(ctx)
	gv := storagev1.SchemeGroupVersion.String()
	served, err := resourceServed(ctx, disc, gv, "volumeattributesclasses")
	switch {
	case err != nil:
		logger.Error(err, "Cannot tell whether the API server serves VolumeAttributesClasses; claims that name one will read it", "groupVersion", gv)
		return true
	case !served:
		logger.Info("The API server does not serve VolumeAttributesClasses: claims that name one are refused with a Warning", "groupVersion", gv)
	}
	return served
}
