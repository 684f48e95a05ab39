package main

import (
	"strings"
	"testing"
)

// kcmRunMetrics is kube-apiserver's apiserver_request_total as a -binder
// kcm run of 100 claims leaves it: some PV creates and claim updates
// rejected with 409 Conflict, writes shed with 429 under load, an event
// PATCH of an expired event (404), reads.
const kcmRunMetrics = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="POST",version="v1"} 100
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="",verb="POST",version="v1"} 100
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="",verb="POST",version="v1"} 22
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="PUT",version="v1"} 400
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="",verb="PUT",version="v1"} 3
apiserver_request_total{code="429",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="status",verb="PUT",version="v1"} 5
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="resource",subresource="status",verb="PUT",version="v1"} 200
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="status",verb="PUT",version="v1"} 100
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 220
apiserver_request_total{code="201",component="apiserver",dry_run="",group="events.k8s.io",resource="events",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="PATCH",version="v1"} 20
apiserver_request_total{code="404",component="apiserver",dry_run="",group="",resource="events",scope="resource",subresource="",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="cluster",subresource="",verb="LIST",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="namespace",subresource="",verb="GET",version="v1"} 7
apiserver_request_total{code="404",component="apiserver",dry_run="",group="",resource="persistentvolumeclaims",scope="namespace",subresource="",verb="GET",version="v1"} 2
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="",verb="GET",version=""} 9
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="",verb="POST",version="v1"} 122
`

// TestParseRequests: object writes and events count what the API server
// took (2xx); a rejected request (409 Conflict, 429 shed under load, 404)
// changed nothing and is listed apart, under its code.
func TestParseRequests(t *testing.T) {
	r, err := parseRequests(strings.NewReader(kcmRunMetrics))
	if err != nil {
		t.Fatal(err)
	}
	// 100 claim creates, 100 PV creates, 400 claim updates, 200 claim and
	// 100 PV status updates.
	if got, want := r.volumeWrites(), 900.0; got != want {
		t.Errorf("volumeWrites = %v, want %v (rejected writes left out)", got, want)
	}
	if got, want := r.events(), 250.0; got != want {
		t.Errorf("events = %v, want %v (both API groups, the 404 PATCH left out)", got, want)
	}
	for _, c := range []struct {
		key  requestKey
		want float64
	}{
		{requestKey{Verb: "POST", Resource: "persistentvolumes"}, 100},
		{requestKey{Verb: "POST", Resource: "persistentvolumes", Code: "409"}, 22},
		{requestKey{Verb: "PUT", Resource: "persistentvolumeclaims", Code: "409"}, 3},
		{requestKey{Verb: "PUT", Resource: "persistentvolumeclaims", Subresource: "status"}, 200},
		{requestKey{Verb: "PUT", Resource: "persistentvolumeclaims", Subresource: "status", Code: "429"}, 5},
		{requestKey{Verb: "PATCH", Resource: "events", Code: "404"}, 2},
		{requestKey{Verb: "GET", Resource: "persistentvolumeclaims"}, 7},
		{requestKey{Verb: "GET", Resource: "persistentvolumeclaims", Code: "404"}, 2},
		{requestKey{Verb: "WATCH", Resource: "persistentvolumes"}, 3}, // a watch ends with code 0
		{requestKey{Verb: "GET"}, 9},
	} {
		if got := r[c.key]; got != c.want {
			t.Errorf("%v = %v, want %v", c.key, got, c.want)
		}
	}
	if got := len(r); got != 16 {
		t.Errorf("%d request kinds, want 16 (no other series): %v", got, r)
	}
}
