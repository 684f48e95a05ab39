package capacity

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// LookupOwner returns the owner reference to put on the CSIStorageCapacity
// objects (see [WithOwner]) for a sidecar running in pod namespace/podName.
// Level 0 is the pod itself, 1 the pod's controller (the ownerReferences
// entry with controller=true: a ReplicaSet, StatefulSet, DaemonSet, ...), 2
// that object's controller (a Deployment for a ReplicaSet), and so on.
//
// It reads the pod and every object below the owner (metadata only), using
// the resource guessed from the apiVersion and kind of the reference that
// points to it, but not the owner itself: its controller reference already
// names it, so level 2 for a Deployment needs `get` on pods and replicasets
// only, the RBAC of upstream's deployment. The returned reference has the
// owner's apiVersion, kind, name and UID, and controller=true. It fails when
// level is negative, when an object cannot be read, or when an object below
// the requested level has no controller; the error names that object. It
// writes nothing and may be retried.
func LookupOwner(ctx context.Context, client metadata.Interface, namespace, podName string, level int) (*metav1.OwnerReference, error) {
	if level < 0 {
		return nil, fmt.Errorf("look up owner of pod %s/%s: level must not be negative, got %d", namespace, podName, level)
	}
	logger := klog.FromContext(ctx)
	ref := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: podName}
	obj, err := getObject(ctx, client, namespace, ref)
	if err != nil {
		return nil, fmt.Errorf("look up owner of pod %s/%s at level %d: %w", namespace, podName, level, err)
	}
	ref.UID = obj.UID
	for i := 1; i <= level; i++ {
		controller := metav1.GetControllerOfNoCopy(obj)
		if controller == nil {
			return nil, fmt.Errorf("look up owner of pod %s/%s at level %d: %s %s/%s has no controller",
				namespace, podName, level, ref.Kind, namespace, obj.Name)
		}
		ref = *controller
		if i == level {
			break
		}
		if obj, err = getObject(ctx, client, namespace, ref); err != nil {
			return nil, fmt.Errorf("look up owner of pod %s/%s at level %d: %w", namespace, podName, level, err)
		}
	}
	logger.V(2).Info("Found owner of CSIStorageCapacity objects", "kind", ref.Kind, "owner", klog.KRef(namespace, ref.Name), "level", level)
	return &metav1.OwnerReference{
		APIVersion: ref.APIVersion,
		Kind:       ref.Kind,
		Name:       ref.Name,
		UID:        ref.UID,
		Controller: ptr.To(true),
	}, nil
}

// getObject reads the object ref points to, in namespace, by metadata.
func getObject(ctx context.Context, client metadata.Interface, namespace string, ref metav1.OwnerReference) (*metav1.PartialObjectMetadata, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("parse apiVersion %q of %s %s: %w", ref.APIVersion, ref.Kind, ref.Name, err)
	}
	if ref.Kind == "" || ref.Name == "" {
		return nil, errors.New("owner reference without kind or name")
	}
	gvr, _ := meta.UnsafeGuessKindToResource(gv.WithKind(ref.Kind))
	obj, err := client.Resource(gvr).Namespace(namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get %s %s/%s: %w", ref.Kind, namespace, ref.Name, err)
	}
	return obj, nil
}
