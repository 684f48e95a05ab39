package main

import (
	"context"
	"fmt"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	authv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// snapshotInformer returns an informer of the VolumeSnapshots of every
// namespace for provisioner.WithSnapshotInformer, or nil when the driver
// does not restore snapshots (no CREATE_DELETE_SNAPSHOT), the API server
// does not serve snapshot.storage.k8s.io/v1 volumesnapshots, or the
// sidecar may not list and watch them (upstream's ClusterRole grants both;
// these are checked once, here, with a log line when one is missing or
// cannot be checked).
// Without it restores work the same, but a claim that waits for its
// snapshot is retried with the library's backoff, and the orphan sweep
// lists the snapshots. The caller runs the informer.
func snapshotInformer(ctx context.Context, caps csiclient.Capabilities, client kubernetes.Interface, snapshots snapclient.Interface, disc discovery.ServerResourcesInterfaceWithContext) (cache.SharedIndexInformer, error) {
	if !caps.CreateDeleteSnapshot {
		return nil, nil
	}
	logger := klog.FromContext(ctx)
	const resource = "volumesnapshots"
	gv := snapv1.SchemeGroupVersion
	served, err := resourceServed(ctx, disc, gv.String(), resource)
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", gv, err)
	}
	if !served {
		logger.Info("The API server does not serve VolumeSnapshots: restores wait for them with the library's backoff", "groupVersion", gv.String())
		return nil, nil
	}
	for _, verb := range []string{"list", "watch"} {
		ok, err := allowed(ctx, client, authv1.ResourceAttributes{Group: gv.Group, Resource: resource, Verb: verb})
		if err != nil {
			// The cache is optional: without it restores still work.
			logger.Info("Could not check whether the sidecar may "+verb+" VolumeSnapshots: restores wait for their snapshots with the library's backoff", "err", err)
			return nil, nil
		}
		if !ok {
			logger.Info("The sidecar may not "+verb+" VolumeSnapshots (upstream's ClusterRole allows it): restores wait for their snapshots with the library's backoff",
				"resource", resource+"."+gv.Group)
			return nil, nil
		}
	}
	return provisioner.NewSnapshotInformer(snapshots), nil
}
