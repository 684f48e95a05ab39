package main

import (
	"context"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
)

// resourceServed reports whether the API server lists resource in
// groupVersion. A group version it does not serve at all is false, not an
// error.
func resourceServed(ctx context.Context, disc discovery.ServerResourcesInterfaceWithContext, groupVersion, resource string) (bool, error) {
	list, err := disc.ServerResourcesForGroupVersionWithContext(ctx, groupVersion)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == resource }), nil
}
