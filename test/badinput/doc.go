// Package badinput is a catalogue of bad inputs to the csi-provisioner
// sidecar, each with its exact expected outcome, run against a real
// kube-apiserver with the real sidecar and hostpath driver binaries:
// StorageClass parameters, claim sizes, access modes, data sources and
// selectors, a StorageClass deleted under a pending claim, a PV edited by
// hand, bad command-line flags and bad CSI endpoints. Each row also checks
// that no driver volume was created or deleted wrongly.
//
// TestSecretsNotLogged provisions with secrets at the highest log levels
// and greps both logs for the secret values.
package badinput
