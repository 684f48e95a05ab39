package main

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/kube-storage/csi-provisioner/pkg/capacity"
	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
)

// newCapacity builds the CSIStorageCapacity publisher of --enable-capacity,
// or returns nil when it is off. It has its own client with the
// --kube-api-capacity-* budget, as upstream, so that publishing capacity
// never takes the provisioner's; the owner lookup of
// --capacity-ownerref-level happens here, once, before leader election.
func newCapacity(ctx context.Context, cfg *Config, restCfg *rest.Config, driver *csiclient.Client, node *provisioner.NodeDeployment, factory informers.SharedInformerFactory, registry k8smetrics.KubeRegistry) (*capacity.Controller, error) {
	if !cfg.EnableCapacity {
		return nil, nil
	}
	caps := driver.Capabilities()
	if !caps.GetCapacity {
		return nil, fmt.Errorf("--enable-capacity: CSI driver %q lacks the GET_CAPACITY controller capability", caps.DriverName)
	}
	capCfg := rest.CopyConfig(restCfg)
	capCfg.QPS, capCfg.Burst = float32(cfg.KubeAPICapacityQPS), cfg.KubeAPICapacityBurst
	client, err := kubernetes.NewForConfig(capCfg)
	if err != nil {
		return nil, fmt.Errorf("create the CSIStorageCapacity client: %w", err)
	}
	opts := []capacity.Option{
		capacity.WithPollInterval(cfg.CapacityPollInterval),
		capacity.WithImmediateBinding(cfg.CapacityForImmediateBinding),
		capacity.WithRetry(cfg.RetryIntervalStart, cfg.RetryIntervalMax),
		capacity.WithMetricsRegistry(registry),
	}
	if node != nil {
		opts = append(opts, capacity.WithNodeDeployment(node.NodeName, node.Topology))
	}
	if cfg.CapacityOwnerrefLevel >= 0 {
		meta, err := metadata.NewForConfig(restCfg)
		if err != nil {
			return nil, fmt.Errorf("create the metadata client for the owner of CSIStorageCapacity objects: %w", err)
		}
		var owner *metav1.OwnerReference
		err = retryTransient(ctx, startupBackoff, "owner of pod "+cfg.Namespace+"/"+cfg.PodName, func(ctx context.Context) error {
			var err error
			owner, err = capacity.LookupOwner(ctx, meta, cfg.Namespace, cfg.PodName, cfg.CapacityOwnerrefLevel)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("--capacity-ownerref-level=%d: %w", cfg.CapacityOwnerrefLevel, err)
		}
		klog.FromContext(ctx).Info("CSIStorageCapacity objects are owned", "kind", owner.Kind, "name", owner.Name, "namespace", cfg.Namespace)
		opts = append(opts, capacity.WithOwner(owner))
	}
	c, err := capacity.New(client, driver, caps.DriverName, cfg.Namespace, factory, opts...)
	if err != nil {
		return nil, fmt.Errorf("create the CSIStorageCapacity publisher: %w", err)
	}
	return c, nil
}
