package binder_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics"

	"github.com/kube-storage/csi-provisioner/pkg/binder"
)

// provisioner stands for the provisioner's implementation of
// binder.ProvisionChecker.
type provisioner struct{}

func (provisioner) CheckProvision(context.Context, *corev1.PersistentVolumeClaim, *storagev1.StorageClass) error {
	return nil
}

func (provisioner) VolumeName(claim *corev1.PersistentVolumeClaim) string {
	return "pvc-" + string(claim.UID)
}

// How cmd/csi-provisioner wires the binder: one shared informer factory for
// all components, the binder constructed before the factory starts, Run in
// its own goroutine until the process is told to stop.
func ExampleNew() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()

	var client kubernetes.Interface = fake.NewClientset() // a real clientset in cmd
	registry := metrics.NewKubeRegistry()                 // served on /metrics
	factory := informers.NewSharedInformerFactory(client, 0)

	b, err := binder.New(client, "csi.example.com", factory,
		binder.WithResyncPeriod(15*time.Second),
		binder.WithWorkers(4),
		binder.WithProvisionCheck(provisioner{}),
		binder.WithMetricsRegistry(registry),
	)
	if err != nil {
		log.Fatal(err)
	}
	// ... construct the provisioner on the same factory ...

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	go func() {
		if err := b.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	// ... run the provisioner, wait for ctx ...
}
