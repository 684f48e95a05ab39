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
