package main

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/refgrant"
)

// referenceGrants returns the ReferenceGrant informer of the
// CrossNamespaceVolumeDataSource gate (one hour resync, as upstream), or nil
// when the gate is off. The caller runs it. Whether the API server serves
// ReferenceGrants, and whether the sidecar may list them, is checked here,
// once: without the Gateway API CRDs or the RBAC, the sidecar stops with a
// one-line error (upstream waits for a cache that never syncs).
func referenceGrants(ctx context.Context, cfg *Config, restCfg *rest.Config, disc discovery.ServerResourcesInterfaceWithContext) (cache.SharedIndexInformer, error) {
	if !cfg.FeatureGates.Enabled(FeatureCrossNamespaceVolumeDataSource) {
		return nil, nil
	}
	const flag = "--feature-gates=" + string(FeatureCrossNamespaceVolumeDataSource) + "=true"
	gvr, err := refgrant.Discover(ctx, disc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	// Custom resources are served as JSON only.
	dynCfg := rest.CopyConfig(restCfg)
	dynCfg.ContentType, dynCfg.AcceptContentTypes = "application/json", "application/json"
	client, err := dynamic.NewForConfig(dynCfg)
	if err != nil {
		return nil, fmt.Errorf("%s: create the ReferenceGrant client: %w", flag, err)
	}
	// One read now, so that missing RBAC stops the sidecar with a clear
	// error rather than an informer that never syncs.
	if err := retryTransient(ctx, startupBackoff, "list "+gvr.Resource, func(ctx context.Context) error {
		_, err := client.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
		return err
	}); err != nil {
		return nil, fmt.Errorf("%s: list %s (the sidecar's ClusterRole needs get, list and watch on them): %w", flag, gvr.GroupResource(), err)
	}
	klog.FromContext(ctx).Info("Claims may use data sources of other namespaces that a ReferenceGrant allows", "resource", gvr.String())
	return refgrant.NewInformer(client, gvr, informerResync), nil
}
