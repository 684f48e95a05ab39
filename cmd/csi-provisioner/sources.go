package main

import (
	"context"
	"fmt"
	"sync"

	snapclient "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-storage/csi-provisioner/pkg/csiclient"
	"github.com/kube-storage/csi-provisioner/pkg/provisioner"
	"github.com/kube-storage/csi-provisioner/pkg/refgrant"
)

// sourceInformers are the optional informers about data sources, nil when
// off: the ReferenceGrants of CrossNamespaceVolumeDataSource and the
// VolumeSnapshots.
type sourceInformers struct {
	grants, snapshots cache.SharedIndexInformer
}

// newSourceInformers builds them (see referenceGrants and
// snapshotInformer).
func newSourceInformers(ctx context.Context, cfg *Config, restCfg *rest.Config, main kubernetes.Interface, snapshots snapclient.Interface, caps csiclient.Capabilities) (*sourceInformers, error) {
	disc := retryingDiscovery{main.Discovery()}
	grants, err := referenceGrants(ctx, cfg, restCfg, disc)
	if err != nil {
		return nil, err
	}
	snaps, err := snapshotInformer(ctx, caps, main, snapshots, disc)
	if err != nil {
		return nil, err
	}
	return &sourceInformers{grants: grants, snapshots: snaps}, nil
}

// options returns the provisioner options that use them.
func (s *sourceInformers) options() []provisioner.Option {
	var opts []provisioner.Option
	if s.grants != nil {
		opts = append(opts, provisioner.WithReferenceGrants(refgrant.NewLister(s.grants.GetIndexer())))
	}
	if s.snapshots != nil {
		opts = append(opts, provisioner.WithSnapshotInformer(s.snapshots))
	}
	return opts
}

// watch registers prov's ReferenceGrant handler (its snapshot handlers come
// with its option).
func (s *sourceInformers) watch(prov *provisioner.Provisioner) error {
	if s.grants == nil {
		return nil
	}
	if _, err := s.grants.AddEventHandler(prov.ReferenceGrantHandler()); err != nil {
		return fmt.Errorf("watch ReferenceGrants: %w", err)
	}
	return nil
}

// run runs them on wg until ctx is done and adds the grants to synced.
func (s *sourceInformers) run(ctx context.Context, wg *sync.WaitGroup, synced map[string]func() bool) {
	if s.snapshots != nil {
		wg.Go(func() { s.snapshots.RunWithContext(ctx) })
	}
	if s.grants != nil {
		wg.Go(func() { s.grants.RunWithContext(ctx) })
		synced["referencegrants"] = s.grants.HasSynced
	}
}

// hasSynced reports whether the grants are known (true without them): a
// claim handled before would be refused and wait for its retry. The
// snapshot cache is optional: its users fall back without it.
func (s *sourceInformers) hasSynced() bool {
	return s.grants == nil || s.grants.HasSynced()
}
