package e2e

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreateOwnerChain creates in namespace a Deployment, a ReplicaSet it
// controls and the pod podName the ReplicaSet controls, as a Deployment's
// controllers would (none run on the test control planes), so that a
// sidecar started with POD_NAME=podName finds the Deployment two owners
// above its pod (--capacity-ownerref-level=2). It returns the Deployment.
func CreateOwnerChain(ctx context.Context, c kubernetes.Interface, namespace, podName string) (*appsv1.Deployment, error) {
	labels := map[string]string{"app": "csi-controller"}
	template := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "csi-provisioner", Image: "csi-provisioner"}}},
	}
	deploy, err := c.AppsV1().Deployments(namespace).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-controller"},
		Spec:       appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: template},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create the owner Deployment: %w", err)
	}
	rs, err := c.AppsV1().ReplicaSets(namespace).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-controller-5d8f", OwnerReferences: []metav1.OwnerReference{
			*metav1.NewControllerRef(deploy, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: template},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create the owner ReplicaSet: %w", err)
	}
	_, err = c.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Labels: labels, OwnerReferences: []metav1.OwnerReference{
			*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec: template.Spec,
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create the sidecar's pod %s: %w", podName, err)
	}
	return deploy, nil
}
