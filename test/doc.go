// Package test holds the integration and end-to-end tests that run the
// sidecar, the example driver and a real kube-apiserver and etcd (see
// internal/controlplane). Each subdirectory is one test package.
package test
