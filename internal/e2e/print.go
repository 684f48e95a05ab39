package e2e

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// The printers write tables with the columns `kubectl get` shows, so the demo
// reads like a terminal session without needing kubectl.

// PrintPVCs writes claims as `kubectl get pvc` does.
func PrintPVCs(w io.Writer, now time.Time, claims ...*corev1.PersistentVolumeClaim) {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tSTATUS\tVOLUME\tCAPACITY\tACCESS MODES\tSTORAGECLASS\tAGE")
	for _, c := range claims {
		capacity := ""
		if q, ok := c.Status.Capacity[corev1.ResourceStorage]; ok {
			capacity = q.String()
		}
		class := ""
		if c.Spec.StorageClassName != nil {
			class = *c.Spec.StorageClassName
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Namespace, c.Name, c.Status.Phase, c.Spec.VolumeName,
			capacity, accessModes(c.Status.AccessModes), class, age(now, c.CreationTimestamp.Time))
	}
	_ = tw.Flush()
}

// PrintPVs writes volumes as `kubectl get pv` does.
func PrintPVs(w io.Writer, now time.Time, volumes ...*corev1.PersistentVolume) {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCAPACITY\tACCESS MODES\tRECLAIM POLICY\tSTATUS\tCLAIM\tSTORAGECLASS\tAGE")
	for _, v := range volumes {
		claim := ""
		if v.Spec.ClaimRef != nil {
			claim = v.Spec.ClaimRef.Namespace + "/" + v.Spec.ClaimRef.Name
		}
		capacity := v.Spec.Capacity[corev1.ResourceStorage]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, capacity.String(), accessModes(v.Spec.AccessModes),
			v.Spec.PersistentVolumeReclaimPolicy, v.Status.Phase, claim, v.Spec.StorageClassName, age(now, v.CreationTimestamp.Time))
	}
	_ = tw.Flush()
}

// PrintEvents writes events oldest first as `kubectl get events` does.
func PrintEvents(w io.Writer, now time.Time, events []corev1.Event) {
	if len(events) == 0 {
		fmt.Fprintln(w, "(no events)")
		return
	}
	sort.SliceStable(events, func(i, j int) bool { return eventTime(events[i]).Before(eventTime(events[j])) })
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "LAST SEEN\tTYPE\tREASON\tOBJECT\tSOURCE\tMESSAGE")
	for _, e := range events {
		obj := strings.ToLower(e.InvolvedObject.Kind) + "/" + e.InvolvedObject.Name
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", age(now, eventTime(e)), e.Type, e.Reason, obj, e.Source.Component, e.Message)
	}
	_ = tw.Flush()
}

// PrintCSIVolumes writes the driver's volumes.
func PrintCSIVolumes(w io.Writer, volumes []*csi.Volume) {
	if len(volumes) == 0 {
		fmt.Fprintln(w, "(the driver has no volumes)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "VOLUME ID\tCAPACITY (bytes)")
	for _, v := range volumes {
		fmt.Fprintf(tw, "%s\t%d\n", v.GetVolumeId(), v.GetCapacityBytes())
	}
	_ = tw.Flush()
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func accessModes(modes []corev1.PersistentVolumeAccessMode) string {
	short := map[corev1.PersistentVolumeAccessMode]string{
		corev1.ReadWriteOnce: "RWO", corev1.ReadOnlyMany: "ROX", corev1.ReadWriteMany: "RWX", corev1.ReadWriteOncePod: "RWOP",
	}
	var out []string
	for _, m := range modes {
		out = append(out, short[m])
	}
	return strings.Join(out, ",")
}

func age(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}
