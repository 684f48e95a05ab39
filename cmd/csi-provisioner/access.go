package main

import (
	"context"
	"fmt"
	"strings"

	authv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// allowed asks the API server, with a SelfSubjectAccessReview, whether the
// sidecar may do what attrs says (in every namespace when attrs names
// none). Transient errors are retried as at start.
func allowed(ctx context.Context, client kubernetes.Interface, attrs authv1.ResourceAttributes) (bool, error) {
	var review *authv1.SelfSubjectAccessReview
	err := retryTransient(ctx, startupBackoff, "access review of "+attrs.Verb+" "+resourceName(attrs), func(ctx context.Context) error {
		var err error
		review, err = client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{
			Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs},
		}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("check whether the sidecar may %s %s: %w", attrs.Verb, resourceName(attrs), err)
	}
	return review.Status.Allowed, nil
}

// resourceName is attrs' resource as RBAC rules and API errors name it:
// resource[/subresource][.group].
func resourceName(attrs authv1.ResourceAttributes) string {
	name := attrs.Resource
	if attrs.Subresource != "" {
		name += "/" + attrs.Subresource
	}
	if attrs.Group != "" {
		name += "." + attrs.Group
	}
	return name
}

// binderAccess is what the binder needs besides the provisioner's reads,
// all of it but the claims update beyond upstream's ClusterRole: it
// watches pods (a WaitForFirstConsumer claim waits for its pod), binds and
// releases volumes and writes both objects' phases. Without any of them it
// would wait for a cache that never syncs, or fail every bind.
var binderAccess = []authv1.ResourceAttributes{
	{Verb: "list", Resource: "pods"},
	{Verb: "watch", Resource: "pods"},
	{Verb: "update", Resource: "persistentvolumes"},
	{Verb: "update", Resource: "persistentvolumes", Subresource: "status"},
	{Verb: "update", Resource: "persistentvolumeclaims"},
	{Verb: "update", Resource: "persistentvolumeclaims", Subresource: "status"},
}

// checkBinderAccess returns an error naming every permission of
// binderAccess the sidecar lacks, and the two ways out (upstream's
// ClusterRole, which a drop-in replacement may still use, has only the
// claims update of them). When the API server does not answer the reviews
// (an authorizer that refuses SelfSubjectAccessReviews), it logs why and
// returns nil: the binder then finds out by itself.
func checkBinderAccess(ctx context.Context, client kubernetes.Interface) error {
	var missing []string
	for _, attrs := range binderAccess {
		ok, err := allowed(ctx, client, attrs)
		if err != nil {
			klog.FromContext(ctx).Info("Could not check the binder's permissions at start", "err", err)
			return nil
		}
		if !ok {
			missing = append(missing, fmt.Sprintf("cannot %s resource %q", attrs.Verb, resourceName(attrs)))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("the binder (--enable-binder, on by default) needs permissions the sidecar's ServiceAccount lacks (%s): "+
		"grant them (deploy/sidecar has the rules) or run with --enable-binder=false to leave binding to kube-controller-manager", strings.Join(missing, ", "))
}
