package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// history records every state of the PVs and of the claims of one namespace
// that a watch reports, from the moment [recordHistory] returns.
type history struct {
	mu     sync.Mutex
	pvs    []pvState
	claims []claimState
	errs   []string
}

// pvState is one observed state of a volume.
type pvState struct {
	event    watch.EventType
	name     string
	uid      types.UID
	rv       string
	phase    corev1.PersistentVolumePhase
	claimRef string // namespace/name, "" without claimRef
	claimUID types.UID
	driver   string // spec.csi.driver
}

// claimState is one observed state of a claim.
type claimState struct {
	event      watch.EventType
	namespace  string
	name       string
	uid        types.UID
	phase      corev1.PersistentVolumeClaimPhase
	volumeName string
}

func (s pvState) String() string {
	return fmt.Sprintf("%s pv %s rv=%s phase=%s claimRef=%s uid=%s", s.event, s.name, s.rv, s.phase, s.claimRef, s.claimUID)
}

func (s claimState) String() string {
	return fmt.Sprintf("%s pvc %s uid=%s phase=%s volumeName=%s", s.event, s.name, s.uid, s.phase, s.volumeName)
}

// recordHistory lists the PVs and the claims of ns and watches them until
// the test ends. It returns once both lists are recorded, so every change
// made after it returns is seen.
func recordHistory(t *testing.T, c kubernetes.Interface, ns string) *history {
	t.Helper()
	h := &history{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})

	pvList, err := c.CoreV1().PersistentVolumes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pvList.Items {
		h.add(watch.Added, &pvList.Items[i])
	}
	claimList, err := c.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range claimList.Items {
		h.add(watch.Added, &claimList.Items[i])
	}

	watchers := []struct {
		rv string
		fn cache.WatchFuncWithContext
	}{
		{pvList.ResourceVersion, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().PersistentVolumes().Watch(ctx, o)
		}},
		{claimList.ResourceVersion, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, o)
		}},
	}
	for _, w := range watchers {
		rw, err := watchtools.NewRetryWatcherWithContext(ctx, w.rv, &cache.ListWatch{WatchFuncWithContext: w.fn})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer rw.Stop()
			for ev := range rw.ResultChan() {
				h.add(ev.Type, ev.Object)
			}
		})
	}
	return h
}

func (h *history) add(event watch.EventType, obj any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch o := obj.(type) {
	case *corev1.PersistentVolume:
		s := pvState{event: event, name: o.Name, uid: o.UID, rv: o.ResourceVersion, phase: o.Status.Phase}
		if ref := o.Spec.ClaimRef; ref != nil {
			s.claimRef, s.claimUID = ref.Namespace+"/"+ref.Name, ref.UID
		}
		if o.Spec.CSI != nil {
			s.driver = o.Spec.CSI.Driver
		}
		h.pvs = append(h.pvs, s)
	case *corev1.PersistentVolumeClaim:
		h.claims = append(h.claims, claimState{event: event, namespace: o.Namespace, name: o.Name, uid: o.UID, phase: o.Status.Phase, volumeName: o.Spec.VolumeName})
	case *metav1.Status:
		h.errs = append(h.errs, fmt.Sprintf("%s: %s", event, o.Message))
	case nil:
	default:
		if event != watch.Bookmark {
			h.errs = append(h.errs, fmt.Sprintf("%s: unexpected %T", event, obj))
		}
	}
}

// volumes returns the recorded states of the volumes for which keep is
// true, in the order seen.
func (h *history) volumes(keep func(pvState) bool) []pvState {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []pvState
	for _, s := range h.pvs {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// claimStates returns the recorded states of the claims.
func (h *history) claimStates() []claimState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]claimState(nil), h.claims...)
}

// watchErrors returns the error events the watches reported.
func (h *history) watchErrors() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.errs...)
}

// checkBindings checks the invariants of binding over the recorded history
// of the volumes of driver and of the claims:
//
//   - a claim's spec.volumeName, once set, never changes (nor is cleared);
//   - a claim, once Bound, stays Bound;
//   - a volume's claimRef UID, once set, never changes (nor is cleared);
//   - no two claims ever name the same volume, and no volume ever names two
//     claims.
//
// It returns one line per violation.
func (h *history) checkBindings(driver string) []string {
	var bad []string
	volumeOf := map[types.UID]string{}       // claim UID -> volumeName
	boundClaim := map[types.UID]bool{}       // claim UID -> was Bound
	claimsOfVolume := map[string]types.UID{} // volume name -> claim UID naming it
	for _, s := range h.claimStates() {
		if s.volumeName != "" {
			if prev, ok := volumeOf[s.uid]; ok && prev != s.volumeName {
				bad = append(bad, fmt.Sprintf("claim %s changed volumeName %s -> %s", s.name, prev, s.volumeName))
			}
			volumeOf[s.uid] = s.volumeName
			if other, ok := claimsOfVolume[s.volumeName]; ok && other != s.uid {
				bad = append(bad, fmt.Sprintf("volume %s named by two claims (%s and %s)", s.volumeName, other, s.uid))
			}
			claimsOfVolume[s.volumeName] = s.uid
		} else if prev, ok := volumeOf[s.uid]; ok {
			bad = append(bad, fmt.Sprintf("claim %s lost volumeName %s: %v", s.name, prev, s))
		}
		if s.phase == corev1.ClaimBound {
			boundClaim[s.uid] = true
		} else if boundClaim[s.uid] {
			bad = append(bad, fmt.Sprintf("claim %s left Bound: %v", s.name, s))
		}
	}
	claimOf := map[types.UID]types.UID{} // volume UID -> claimRef UID
	for _, s := range h.volumes(func(s pvState) bool { return s.driver == driver }) {
		prev, seen := claimOf[s.uid]
		switch {
		case s.claimUID != "" && seen && prev != s.claimUID:
			bad = append(bad, fmt.Sprintf("volume %s changed claimRef UID %s -> %s", s.name, prev, s.claimUID))
		case s.claimUID == "" && seen:
			bad = append(bad, fmt.Sprintf("volume %s lost claimRef UID %s: %v", s.name, prev, s))
		}
		if s.claimUID != "" {
			claimOf[s.uid] = s.claimUID
		}
	}
	return bad
}
