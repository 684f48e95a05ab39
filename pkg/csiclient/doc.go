// Package csiclient is the sidecar's only boundary to the CSI driver and the
// only package that speaks gRPC. It connects to the driver's unix socket,
// waits for Probe, discovers the driver's name and capabilities once, carries
// CreateVolume and DeleteVolume with a per-call timeout, and classifies every
// error into what the caller must do next (see [Class]).
//
// It never imports client-go: it knows nothing of Kubernetes objects.
package csiclient
