package cachetrim

import corev1 "k8s.io/api/core/v1"

// trimPod keeps only the pod fields the binder reads: identity, deletion,
// node, phase and the volumes that name a claim.
func trimPod(pod *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{}
	out.Namespace, out.Name, out.UID = str(pod.Namespace), pod.Name, pod.UID
	out.ResourceVersion, out.DeletionTimestamp = pod.ResourceVersion, pod.DeletionTimestamp
	out.Spec.NodeName = str(pod.Spec.NodeName)
	out.Status.Phase = corev1.PodPhase(str(string(pod.Status.Phase)))
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil {
			out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{
				Name: v.Name,
				VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: v.PersistentVolumeClaim,
					// The claim of a generic ephemeral volume is named after the
					// pod and the volume; its template is not needed.
					Ephemeral: trimEphemeral(v.Ephemeral),
				},
			})
		}
	}
	return out
}

func trimEphemeral(e *corev1.EphemeralVolumeSource) *corev1.EphemeralVolumeSource {
	if e == nil {
		return nil
	}
	return &corev1.EphemeralVolumeSource{}
}
