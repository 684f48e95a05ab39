// Package refgrant reads the Gateway API's ReferenceGrants
// (gateway.networking.k8s.io), the objects with which the owner of a
// namespace lets objects of other namespaces refer to objects of theirs.
// The provisioner uses them, under the CrossNamespaceVolumeDataSource
// feature, for a claim whose dataSourceRef names a claim or a VolumeSnapshot
// of another namespace: upstream external-provisioner's rule, with its
// matching.
//
// ReferenceGrants are a custom resource: the cluster must have the Gateway
// API's CRD. They are read through the dynamic client, so the sidecar does
// not link the Gateway API's generated clients; [Discover] picks the newest
// version the API server serves (v1, else v1beta1, the version upstream
// reads; their spec is the same).
package refgrant

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// Group is the Gateway API group; Resource the plural of ReferenceGrant.
const (
	Group    = "gateway.networking.k8s.io"
	Resource = "referencegrants"
)

// versions are the versions of ReferenceGrant read, preferred first.
var versions = []string{"v1", "v1beta1"}

// claimKind is the kind a grant's "from" must name for claims (core group).
const claimKind = "PersistentVolumeClaim"

// ErrNotServed says that the API server serves no ReferenceGrant version
// this package reads: the Gateway API CRDs are not installed.
var ErrNotServed = errors.New("the API server does not serve " + Resource + "." + Group + " (v1 or v1beta1): install the Gateway API CRDs")

// Discover returns the ReferenceGrant resource of the newest version the
// API server serves, or an error wrapping [ErrNotServed] when it serves
// none.
func Discover(ctx context.Context, d discovery.ServerResourcesInterfaceWithContext) (schema.GroupVersionResource, error) {
	for _, v := range versions {
		gv := schema.GroupVersion{Group: Group, Version: v}
		list, err := d.ServerResourcesForGroupVersionWithContext(ctx, gv.String())
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return schema.GroupVersionResource{}, fmt.Errorf("discover %s: %w", gv, err)
		}
		if slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == Resource }) {
			return gv.WithResource(Resource), nil
		}
	}
	return schema.GroupVersionResource{}, ErrNotServed
}

// NewInformer returns an informer of the ReferenceGrants of every
// namespace, indexed by namespace, with the given resync period (upstream:
// one hour). The caller runs it.
func NewInformer(client dynamic.Interface, gvr schema.GroupVersionResource, resync time.Duration) cache.SharedIndexInformer {
	return dynamicinformer.NewFilteredDynamicInformer(client, gvr, "", resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}, nil).Informer()
}

// Reference is the object a claim refers to: a data source in Namespace.
// Group is "" for the core group.
type Reference struct {
	Namespace, Group, Kind, Name string
}

// Lister answers from the cache of an informer built by [NewInformer].
type Lister struct {
	indexer cache.Indexer
}

// NewLister returns a Lister reading indexer, which must have the
// namespace index ([cache.NamespaceIndex]).
func NewLister(indexer cache.Indexer) *Lister {
	return &Lister{indexer: indexer}
}

// Allows reports whether a ReferenceGrant in the namespace of to lets the
// PersistentVolumeClaims of fromNamespace refer to it: one grant must have
// a "from" of group "", kind PersistentVolumeClaim and namespace
// fromNamespace, and a "to" of to's group and kind whose name is empty or
// to's name. A grant that cannot be read is skipped.
func (l *Lister) Allows(fromNamespace string, to Reference) (bool, error) {
	objs, err := l.indexer.ByIndex(cache.NamespaceIndex, to.Namespace)
	if err != nil {
		return false, fmt.Errorf("list %s in namespace %s: %w", Resource, to.Namespace, err)
	}
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var g grant
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &g); err != nil {
			continue
		}
		if g.allows(fromNamespace, to) {
			return true, nil
		}
	}
	return false, nil
}

// grant is the part of a ReferenceGrant read here.
type grant struct {
	Spec struct {
		From []grantFrom `json:"from"`
		To   []grantTo   `json:"to"`
	} `json:"spec"`
}

type grantFrom struct {
	Group     string `json:"group"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
}

type grantTo struct {
	Group string  `json:"group"`
	Kind  string  `json:"kind"`
	Name  *string `json:"name,omitempty"`
}

func (g *grant) allows(fromNamespace string, to Reference) bool {
	from := slices.ContainsFunc(g.Spec.From, func(f grantFrom) bool {
		return f.Group == "" && f.Kind == claimKind && f.Namespace == fromNamespace
	})
	return from && slices.ContainsFunc(g.Spec.To, func(t grantTo) bool {
		return t.Group == to.Group && t.Kind == to.Kind && (t.Name == nil || *t.Name == "" || *t.Name == to.Name)
	})
}
