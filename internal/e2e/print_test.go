package e2e

import (
	"bytes"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPrintEvents(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	ev := func(reason string, ago time.Duration) corev1.Event {
		return corev1.Event{
			InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Name: "data"},
			Type:           corev1.EventTypeNormal, Reason: reason, Message: reason + " message",
			Source:        corev1.EventSource{Component: "p"},
			LastTimestamp: metav1.NewTime(now.Add(-ago)),
		}
	}
	for _, tc := range []struct {
		name   string
		events []corev1.Event
		want   string
	}{
		{name: "none", want: "(no events)\n"},
		{
			name:   "oldest first",
			events: []corev1.Event{ev("ProvisioningSucceeded", time.Second), ev("Provisioning", 2*time.Second)},
			want: "LAST SEEN   TYPE     REASON                  OBJECT                       SOURCE   MESSAGE\n" +
				"2s          Normal   Provisioning            persistentvolumeclaim/data   p        Provisioning message\n" +
				"1s          Normal   ProvisioningSucceeded   persistentvolumeclaim/data   p        ProvisioningSucceeded message\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			PrintEvents(&b, now, tc.events)
			if b.String() != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), tc.want)
			}
		})
	}
}
