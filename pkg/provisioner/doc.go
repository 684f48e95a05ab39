// Package provisioner turns PersistentVolumeClaims into CSI volumes and CSI
// volumes into PersistentVolumes. It implements the Provisioner, Qualifier
// and BlockProvisioner interfaces of sig-storage-lib-external-provisioner v13,
// whose ProvisionController drives it: PVC + StorageClass → CreateVolume
// request; response → PV; released PV → DeleteVolume.
package provisioner
