package binder

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// TestConcurrentBinding runs the binder with several workers on many claims
// racing for a few static volumes, against a fake API server with real
// informers, and checks that no volume is bound twice and no claim is bound
// twice: not in the final state, and not at any moment of the write history.
// It runs once with the API server's resourceVersion check and once without
// it, where the binder's reservation mutex alone must keep bindings unique.
func TestConcurrentBinding(t *testing.T) {
	const (
		claims  = 40
		volumes = 5
		workers = 4
	)
	for _, ignoreRV := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignoreResourceVersion=%v", ignoreRV), func(t *testing.T) {
			state := objs(classFast())
			for i := range volumes {
				state = append(state, volumeB(fmt.Sprintf("pv%d", i)).Class("fast").Obj())
			}
			for i := range claims {
				state = append(state, claimB(fmt.Sprintf("c%02d", i)).Class("fast").Obj())
			}
			client := fake.NewSimpleClientset(state...)
			api := installAPIServer(client)
			api.ignoreRV = ignoreRV

			var mu sync.Mutex
			var violations []string
			reservations := 0
			api.observe = func(old, updated runtime.Object) {
				mu.Lock()
				defer mu.Unlock()
				switch o := old.(type) {
				case *corev1.PersistentVolume:
					n := updated.(*corev1.PersistentVolume)
					if o.Spec.ClaimRef == nil && n.Spec.ClaimRef != nil {
						reservations++
					}
					if o.Spec.ClaimRef != nil && o.Spec.ClaimRef.UID != "" &&
						(n.Spec.ClaimRef == nil || n.Spec.ClaimRef.UID != o.Spec.ClaimRef.UID) {
						violations = append(violations, fmt.Sprintf("volume %s moved from claim %s to %v", o.Name, o.Spec.ClaimRef.Name, n.Spec.ClaimRef))
					}
				case *corev1.PersistentVolumeClaim:
					n := updated.(*corev1.PersistentVolumeClaim)
					if o.Spec.VolumeName != "" && n.Spec.VolumeName != o.Spec.VolumeName {
						violations = append(violations, fmt.Sprintf("claim %s moved from volume %s to %s", o.Name, o.Spec.VolumeName, n.Spec.VolumeName))
					}
				}
			}

			ctx := klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2))))
			factory := informers.NewSharedInformerFactory(client, 0)
			b, err := New(client, driver, factory, WithWorkers(workers), WithEventRecorder(&eventLog{}))
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			factory.Start(runCtx.Done())
			done := make(chan error, 1)
			go func() { done <- b.Run(runCtx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
				factory.Shutdown()
			}()

			// Wait until every volume is bound and every other claim was
			// handed to the provisioner.
			f := &fixture{t: t, client: client}
			err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
				boundVolumes, settledClaims := 0, 0
				for _, pv := range f.volumes() {
					if pv.Status.Phase == corev1.VolumeBound {
						boundVolumes++
					}
				}
				for _, c := range f.claims() {
					if c.Status.Phase == corev1.ClaimBound || c.Annotations[annProvisioner] == driver {
						settledClaims++
					}
				}
				return boundVolumes == volumes && settledClaims == claims, nil
			})
			if err != nil {
				t.Errorf("bindings did not settle: %v", err)
			}

			byUID := map[string]*corev1.PersistentVolumeClaim{}
			usedVolumes := map[string]string{}
			boundClaims := 0
			for _, c := range f.claims() {
				byUID[string(c.UID)] = c
				if c.Spec.VolumeName == "" {
					continue
				}
				boundClaims++
				if other, ok := usedVolumes[c.Spec.VolumeName]; ok {
					t.Errorf("claims %s and %s both name volume %s", other, c.Name, c.Spec.VolumeName)
				}
				usedVolumes[c.Spec.VolumeName] = c.Name
			}
			for _, pv := range f.volumes() {
				ref := pv.Spec.ClaimRef
				if ref == nil {
					t.Errorf("volume %s is not bound", pv.Name)
					continue
				}
				c := byUID[string(ref.UID)]
				if c == nil || c.Spec.VolumeName != pv.Name || c.Status.Phase != corev1.ClaimBound {
					t.Errorf("volume %s points to claim %s, which is not bound to it", pv.Name, ref.Name)
				}
			}
			if boundClaims != volumes {
				t.Errorf("%d claims bound, want %d", boundClaims, volumes)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, v := range violations {
				t.Errorf("write history: %s", v)
			}
			if reservations != volumes {
				t.Errorf("%d volume reservations written, want %d (one per volume)", reservations, volumes)
			}
		})
	}
}
