// Package testutil holds builders for the API objects tests use
// (PersistentVolumeClaims, PersistentVolumes, StorageClasses, Nodes, Pods),
// shared by unit tests and the integration tests in test/.
package testutil
