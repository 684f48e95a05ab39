package main

import (
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// eventSplitClient is a clientset whose event writes go through a second
// clientset with a rate limiter of its own. Events are written by a single
// goroutine per recorder, after the fact; on a shared budget they would
// delay volume writes, and volume writes would delay (or, past the
// recorder's 1000-event queue, drop) the events that explain a Pending
// claim. The provisioner library takes one clientset for both, so this
// wrapper routes only CoreV1().Events to the event clientset.
type eventSplitClient struct {
	kubernetes.Interface
	events kubernetes.Interface
}

func (c eventSplitClient) CoreV1() typedcorev1.CoreV1Interface {
	return coreV1WithEvents{CoreV1Interface: c.Interface.CoreV1(), events: c.events.CoreV1()}
}

type coreV1WithEvents struct {
	typedcorev1.CoreV1Interface
	events typedcorev1.CoreV1Interface
}

func (c coreV1WithEvents) Events(namespace string) typedcorev1.EventInterface {
	return c.events.Events(namespace)
}
