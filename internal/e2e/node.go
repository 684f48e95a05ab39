package e2e

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// TopologyKey is the topology segment the hostpath driver reports, with its
// node ID as the value.
const TopologyKey = "topology.hostpath.csi/node"

// RegisterNode plays the kubelet's part for a driver started with
// Topology: it makes sure the Node named after the driver's node ID exists
// with the driver's topology label, and that the node's CSINode lists the
// driver with its topology key. Several drivers may register on one node;
// each adds its own entry.
func (d *Driver) RegisterNode(ctx context.Context, c kubernetes.Interface) error {
	labels := map[string]string{TopologyKey: d.NodeID, corev1.LabelHostname: d.NodeID}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := c.CoreV1().Nodes().Get(ctx, d.NodeID, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: d.NodeID, Labels: labels}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("nodes"), d.NodeID, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if node.Labels[TopologyKey] == d.NodeID {
			return nil
		}
		node = node.DeepCopy()
		metav1.SetMetaDataLabel(&node.ObjectMeta, TopologyKey, d.NodeID)
		_, err = c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("register node %s: %w", d.NodeID, err)
	}
	entry := storagev1.CSINodeDriver{Name: d.Name, NodeID: d.NodeID, TopologyKeys: []string{TopologyKey}}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		csiNode, err := c.StorageV1().CSINodes().Get(ctx, d.NodeID, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = c.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{
				ObjectMeta: metav1.ObjectMeta{Name: d.NodeID},
				Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{entry}},
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(storagev1.Resource("csinodes"), d.NodeID, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if slices.ContainsFunc(csiNode.Spec.Drivers, func(e storagev1.CSINodeDriver) bool { return e.Name == d.Name }) {
			return nil
		}
		csiNode = csiNode.DeepCopy()
		csiNode.Spec.Drivers = append(csiNode.Spec.Drivers, entry)
		_, err = c.StorageV1().CSINodes().Update(ctx, csiNode, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("register driver %s on CSINode %s: %w", d.Name, d.NodeID, err)
	}
	return nil
}
