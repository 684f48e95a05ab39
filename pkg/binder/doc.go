// Package binder binds PersistentVolumeClaims to PersistentVolumes and
// reclaims released volumes for one CSI driver: the job of
// kube-controller-manager's persistentvolume-binder, scoped to the claims and
// volumes of this driver, so that a cluster does not need that controller for
// them.
//
// It never imports csiclient or gRPC: it only reads and writes API objects.
package binder
