// Package chaos runs the real csi-provisioner (two replicas with leader
// election) and the hostpath driver (dir backend, with injected failures,
// latencies and hangs) against a real kube-apiserver, creates and deletes
// claims continuously while it kills sidecars, the leader, the driver and
// restarts kube-apiserver, and then checks the invariants in invariants.go
// on the final state and on a watch history of every PV and PVC.
//
// TestChaos runs a short version (100 claims) in `go test ./...`; with
// CHAOS_LONG=1 (`make chaos`) it runs 1000 claims and 50 sidecar kills.
// CHAOS_SEED replays a run's random choices (timing still varies);
// CHAOS_KEEP_LOGS=1 keeps the logs of a passing run (a failing run always
// keeps them). The flags -chaos.claims and -chaos.kills override the sizes
// (make chaos ARGS="-chaos.claims=2000").
package chaos
