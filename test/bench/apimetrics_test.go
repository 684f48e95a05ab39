package main

import (
	"testing"
	"time"
)

// TestRecordAPIRate: the write rate is over the phase, like the
// throughput; events written after the last claim was Bound count per
// volume only.
func TestRecordAPIRate(t *testing.T) {
	const n = 100
	untilBound := requestCounts{
		{Verb: "POST", Resource: "persistentvolumeclaims"}:                       n, // the benchmark's creates
		{Verb: "POST", Resource: "persistentvolumes"}:                            n,
		{Verb: "PUT", Resource: "persistentvolumeclaims"}:                        2 * n,
		{Verb: "PUT", Resource: "persistentvolumes", Subresource: "status"}:      n,
		{Verb: "PUT", Resource: "persistentvolumeclaims", Subresource: "status"}: n,
		{Verb: "POST", Resource: "events"}:                                       n / 2,
		{Verb: "LIST", Resource: "pods"}:                                         3, // not a write
	}
	settled := requestCounts{}
	for k, v := range untilBound {
		settled[k] = v
	}
	settled[requestKey{Verb: "POST", Resource: "events"}] = n // half the events came after the phase

	b := &bench{o: options{N: n}}
	res := &result{Ceiling: ceiling{WritesPerSecond: 1300}}
	b.recordAPI(t.Context(), res, settled, untilBound, 500*time.Millisecond)
	if want := (6*n + n/2) / 0.5; res.Provision.WritesPerSecond != want {
		t.Errorf("WritesPerSecond = %v, want %v (the writes until the last Bound over the phase)", res.Provision.WritesPerSecond, want)
	}
	if want := 1300.0 / 1300; res.Provision.WriteFractionOfCeiling != want {
		t.Errorf("WriteFractionOfCeiling = %v, want %v", res.Provision.WriteFractionOfCeiling, want)
	}
	if res.API.WritesPerVolume != 5 || res.API.EventsPerVolume != 1 {
		t.Errorf("per volume: %v writes, %v events; want 5 and 1 (benchmark's creates excluded, settled events included)", res.API.WritesPerVolume, res.API.EventsPerVolume)
	}
}

// TestProvisionerWrites: the provisioner's event updates (PATCH) are not
// object writes, nor are its rejected requests (409 Conflict: a PV that
// already exists, a claim changed meanwhile); its updates and the PV creates
// the API server took are. The counters are those of a -binder kcm run
// (test/bench/runs/kcm-binder-rate20.json, N=400: 563 PV creates, 163 of
// them rejected).
func TestProvisionerWrites(t *testing.T) {
	sidecar := map[string]float64{
		`rest_client_requests_total{code="200",host="h",method="GET"}`:   102,
		`rest_client_requests_total{code="200",host="h",method="PATCH"}`: 326,
		`rest_client_requests_total{code="200",host="h",method="PUT"}`:   800,
		`rest_client_requests_total{code="201",host="h",method="POST"}`:  1200,
		`rest_client_requests_total{code="409",host="h",method="POST"}`:  163,
		`rest_client_requests_total{code="409",host="h",method="PUT"}`:   97,
	}
	d := requestCounts{
		{Verb: "POST", Resource: "persistentvolumes"}:              400,
		{Verb: "POST", Resource: "persistentvolumes", Code: "409"}: 163,
		{Verb: "PATCH", Resource: "events"}:                        965,
	}
	if got, want := provisionerWrites(sidecar, d), 800.0+400; got != want {
		t.Errorf("provisionerWrites = %v, want %v (PUTs and PV creates taken, no event PATCH, no 409)", got, want)
	}
	if got := provisionerWrites(nil, d); got != 0 {
		t.Errorf("without request counters: %v, want 0", got)
	}
}
