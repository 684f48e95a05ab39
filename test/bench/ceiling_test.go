package main

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
)

// TestCeilingWriterLeavesNothing: once the ceiling is measured, none of the
// writer's claims and volumes is left for the sidecar or
// kube-controller-manager to meet in the run. The PV protection controller
// puts a finalizer removed from a PV that is not being deleted back, and
// keeps a Bound PV's: a removal that dropped the finalizers before the
// delete left about 3% of the PVs terminating for good.
func TestCeilingWriterLeavesNothing(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Config{ControllerManagerQPS: 1000, ControllerManagerBurst: 2000})
	b := newBench(cp, options{CeilingN: 500, Concurrency: 64})
	if _, err := b.measureCeiling(t.Context(), "ceiling"); err != nil {
		t.Fatal(err)
	}
	pvs, err := b.c.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvcs, err := b.c.CoreV1().PersistentVolumeClaims("ceiling").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, pv := range pvs.Items {
		left = append(left, fmt.Sprintf("PV %s (finalizers %v, deleting %v, %s)", pv.Name, pv.Finalizers, pv.DeletionTimestamp != nil, pv.Status.Phase))
	}
	for _, pvc := range pvcs.Items {
		left = append(left, "PVC "+pvc.Name)
	}
	if len(left) > 0 {
		t.Errorf("%d objects left after the ceiling: %v", len(left), left)
	}
}
