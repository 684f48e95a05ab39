package main

import (
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/kube-storage/csi-provisioner/internal/events"
)

// supersededEvents: the provisioning library's "Provisioning" event of a
// claim (sent before CreateVolume) tells nothing more once the claim's
// "ProvisioningSucceeded" is queued too. When the API server is behind and
// the first still waits to be written, only the second is: one event write
// per volume less under load, the same two events otherwise. Failures
// supersede nothing.
var supersededEvents = map[string]string{"ProvisioningSucceeded": "Provisioning"}

// eventSplitClient is a clientset whose event writes go through a second
// clientset with a rate limiter of its own, queued on an events.Writer. On
// a shared budget events would delay volume writes, and volume writes would
// delay the events that explain a Pending claim; written one at a time by
// client-go's broadcasters (ours and the provisioning library's own), they
// are dropped under load. The provisioner library takes one clientset for
// both, so this wrapper routes only CoreV1().Events.
type eventSplitClient struct {
	kubernetes.Interface
	core typedcorev1.CoreV1Interface
}

// newEventSplitClient returns main with CoreV1().Events served by eventClient
// through w. The CoreV1 wrapper is built once, not on every request.
func newEventSplitClient(main, eventClient kubernetes.Interface, w *events.Writer) eventSplitClient {
	return eventSplitClient{
		Interface: main,
		core:      coreV1WithEvents{CoreV1Interface: main.CoreV1(), events: eventClient.CoreV1(), writer: w},
	}
}

func (c eventSplitClient) CoreV1() typedcorev1.CoreV1Interface { return c.core }

type coreV1WithEvents struct {
	typedcorev1.CoreV1Interface
	events typedcorev1.CoreV1Interface
	writer *events.Writer
}

func (c coreV1WithEvents) Events(namespace string) typedcorev1.EventInterface {
	return c.writer.Wrap(c.events.Events(namespace))
}
