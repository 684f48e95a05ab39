package main

import (
	"errors"
	"strings"
	"testing"

	authv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestCheckBinderAccess: the binder's start-up check names each permission
// the sidecar lacks and the two ways out; one it cannot check (the access
// review refused) does not stop the sidecar.
func TestCheckBinderAccess(t *testing.T) {
	tests := []struct {
		name      string
		denied    []string // "verb resource[/subresource]"
		reviewErr error
		wantErr   string
	}{
		{name: "all granted (the chart's ClusterRole)"},
		{
			// Upstream's ClusterRole: only the claims update of these.
			name:   "upstream's ClusterRole",
			denied: []string{"list pods", "watch pods", "update persistentvolumes", "update persistentvolumes/status", "update persistentvolumeclaims/status"},
			wantErr: `the binder (--enable-binder, on by default) needs permissions the sidecar's ServiceAccount lacks (` +
				`cannot list resource "pods", cannot watch resource "pods", cannot update resource "persistentvolumes", ` +
				`cannot update resource "persistentvolumes/status", cannot update resource "persistentvolumeclaims/status"): ` +
				`grant them (deploy/sidecar has the rules) or run with --enable-binder=false to leave binding to kube-controller-manager`,
		},
		{name: "one missing", denied: []string{"update persistentvolumeclaims/status"}, wantErr: `(cannot update resource "persistentvolumeclaims/status")`},
		{name: "access reviews refused: not checked", reviewErr: errors.New(`selfsubjectaccessreviews.authorization.k8s.io is forbidden`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				review := a.(k8stesting.CreateAction).GetObject().(*authv1.SelfSubjectAccessReview)
				attrs := review.Spec.ResourceAttributes
				res := attrs.Resource
				if attrs.Subresource != "" {
					res += "/" + attrs.Subresource
				}
				if attrs.Namespace != "" || attrs.Group != "" {
					t.Errorf("review of %s %s in namespace %q, group %q; want every namespace of the core group", attrs.Verb, res, attrs.Namespace, attrs.Group)
				}
				review.Status.Allowed = true
				for _, d := range tt.denied {
					if d == attrs.Verb+" "+res {
						review.Status.Allowed = false
					}
				}
				return true, review, tt.reviewErr
			})
			err := checkBinderAccess(t.Context(), client)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("checkBinderAccess = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
