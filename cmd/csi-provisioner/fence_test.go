package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// TestFence drives the fence through the election client's Lease calls
// and checks which writes it lets through and when the hold is lost.
func TestFence(t *testing.T) {
	const (
		leaseName = "driver"
		ns        = "kube-system"
		duration  = time.Hour // the fence's own timer never fires here
	)
	lease := func(holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName, Namespace: ns}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	}
	// A step is one call: "create <holder>" and "update <holder>" are the
	// election's writes ("update " releases), "get" its read, "taken <holder>"
	// another process's write, "wait <duration>" the clock moving on.
	tests := []struct {
		name      string
		steps     []string
		wantAllow bool
		wantLost  string
	}{
		{name: "never led", wantAllow: false},
		{name: "acquired by creating the Lease", steps: []string{"create me"}, wantAllow: true},
		{name: "renewed within the Lease duration", steps: []string{"create me", "wait 59m", "update me", "wait 59m"}, wantAllow: true},
		{name: "not renewed for the Lease duration (paused)", steps: []string{"create me", "wait 1h"}, wantAllow: false, wantLost: "last renewed 1h0m0s ago"},
		{name: "the Lease read names another holder", steps: []string{"create me", "taken other", "get"}, wantAllow: false, wantLost: "held by other"},
		{name: "a standby reads the leader's Lease", steps: []string{"taken other", "get"}, wantAllow: false},
		{name: "released", steps: []string{"create me", "update "}, wantAllow: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			now := time.Unix(1000, 0)
			var lost []string
			f := newFence(duration, func(reason string) { lost = append(lost, reason) })
			f.now = func() time.Time { return now }
			client := fake.NewClientset()
			leases := electionClient{Interface: client, fence: f}.CoordinationV1().Leases(ns)
			for _, st := range tt.steps {
				op, arg, _ := strings.Cut(st, " ")
				var err error
				switch op {
				case "create":
					_, err = leases.Create(ctx, lease(arg), metav1.CreateOptions{})
				case "update":
					_, err = leases.Update(ctx, lease(arg), metav1.UpdateOptions{})
				case "get":
					_, err = leases.Get(ctx, leaseName, metav1.GetOptions{})
				case "taken":
					if _, err = client.CoordinationV1().Leases(ns).Update(ctx, lease(arg), metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
						_, err = client.CoordinationV1().Leases(ns).Create(ctx, lease(arg), metav1.CreateOptions{})
					}
				case "wait":
					var d time.Duration
					if d, err = time.ParseDuration(arg); err == nil {
						now = now.Add(d)
					}
				}
				if err != nil {
					t.Fatalf("%s: %v", st, err)
				}
			}
			rt := f.wrap(okTransport{})
			for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
				req, _ := http.NewRequestWithContext(ctx, method, "https://api/api/v1/namespaces/ns/events", nil)
				_, err := rt.RoundTrip(req)
				if got := err == nil; got != tt.wantAllow {
					t.Errorf("%s allowed = %v (%v), want %v", method, got, err, tt.wantAllow)
				}
				if err != nil && !errors.Is(err, errFenced) {
					t.Errorf("%s refused with %v, want errFenced", method, err)
				}
			}
			for _, req := range []*http.Request{
				mustRequest(t, http.MethodGet, "https://api/api/v1/persistentvolumes?watch=true"),
				mustRequest(t, http.MethodPost, "https://api/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"),
			} {
				if _, err := rt.RoundTrip(req); err != nil {
					t.Errorf("%s %s refused: %v", req.Method, req.URL.Path, err)
				}
			}
			switch {
			case tt.wantLost == "" && len(lost) > 0:
				t.Errorf("lost(%q), want no call", lost)
			case tt.wantLost != "" && (len(lost) != 1 || !strings.Contains(lost[0], tt.wantLost)):
				t.Errorf("lost calls = %q, want one containing %q", lost, tt.wantLost)
			}
		})
	}
}

type okTransport struct{}

func (okTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestFenceAccessReviewBehindAPath: access reviews go through the fence
// before this process leads, also when the kubeconfig's server URL has a
// path (a proxy such as Rancher's): the start-up checks would otherwise
// fail, or skip, on such clusters.
func TestFenceAccessReviewBehindAPath(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"SelfSubjectAccessReview","apiVersion":"authorization.k8s.io/v1","status":{"allowed":true}}`))
	}))
	defer srv.Close()
	for _, host := range []string{srv.URL, srv.URL + "/k8s/clusters/c-abc12"} {
		cfg := &rest.Config{Host: host}
		cfg.Wrap(newFence(15*time.Second, func(string) {}).wrap)
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ok, err := allowed(t.Context(), client, authv1.ResourceAttributes{Verb: "list", Resource: "volumesnapshots", Group: "snapshot.storage.k8s.io"})
		if err != nil || !ok {
			t.Errorf("server %s: allowed = %v, %v; want true (the fence lets access reviews through)", host, ok, err)
		}
	}
}

// TestFenceLeaseDurationWholeSeconds: the Lease records its duration in
// whole seconds, and the other replicas take it over after that record:
// the fence stops writes by the same measure, not the flag's fraction.
func TestFenceLeaseDurationWholeSeconds(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newFence(1900*time.Millisecond, func(string) {})
	f.now = func() time.Time { return now }
	me := "me"
	f.wrote(now, &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: &me}})
	now = now.Add(1500 * time.Millisecond) // the recorded 1s has passed
	if err := f.allow(); !errors.Is(err, errFenced) {
		t.Errorf("allow = %v 1.5s after the renewal of a Lease that records 1s, want errFenced", err)
	}
}
