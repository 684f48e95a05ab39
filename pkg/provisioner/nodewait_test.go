package provisioner

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-storage/csi-provisioner/internal/events"
	"github.com/kube-storage/csi-provisioner/internal/testutil"
)

// TestNodeDeploymentExplainUntaken covers the one event that explains an
// Immediate claim no node takes in node deployment: after a capacity
// decline, posted unless another node takes the claim within the grace
// period (1.5 × MaxDelay); at once when immediate binding is off; once per
// claim, not again when another node posted it first (same name), and
// renewed (count + 1) when the claim is declined again and the
// explanation is events.RefreshInterval old, so that the API server's
// event TTL does not take it away.
func TestNodeDeploymentExplainUntaken(t *testing.T) {
	const (
		baseDelay = 10 * time.Second
		maxDelay  = 20 * time.Second
		grace     = 30 * time.Second
	)
	short := &csi.GetCapacityResponse{AvailableCapacity: gi - 1}
	const noRoom = "no node took the claim within 30s: node n9 has not enough capacity: 1073741823 bytes available, 1073741824 requested. In node deployment"
	const immediateOff = `no node takes this claim: its storageclass "sc" binds Immediately, and the provisioners of test.csi.example.com run on each node (--node-deployment) with --node-deployment-immediate-binding=false`
	tests := []struct {
		name         string
		capacity     *fakeCapacity
		immediateOff bool
		class        *storagev1.StorageClass // newClass() when nil
		// graceStep, when set, replaces grace as the clock step after
		// the decline; at 3 × maxDelay into it this node must still wait
		// (an allowed node's capacity explanation would come first).
		graceStep time.Duration
		// existingAge, when positive, creates the event before the test,
		// from node n1, that long ago.
		existingAge time.Duration
		// afterDecline runs after the first sync declined the claim,
		// before the grace period ends.
		afterDecline func(t *testing.T, h *harness)
		// later adds a third sync events.RefreshInterval after the first
		// explanation.
		later       bool
		wantMessage string // of the claim's event; "" for no event
		wantHost    string
		wantCount   int32
		// event creates and updates this node sent
		wantCreates, wantUpdates int
	}{
		{
			name: "not enough capacity, no node takes it", capacity: &fakeCapacity{resp: short},
			wantMessage: noRoom, wantHost: thisNode, wantCount: 1, wantCreates: 1,
		},
		{
			name: "another node takes it within the grace period", capacity: &fakeCapacity{resp: short},
			afterDecline: func(t *testing.T, h *harness) {
				h.selectNode(t, "c", "n1")
			},
		},
		{
			name: "another node explained it first", capacity: &fakeCapacity{resp: short}, existingAge: time.Minute,
			wantMessage: "from n1", wantHost: "n1", wantCount: 1, wantCreates: 1,
		},
		{
			name: "another node's explanation is an hour old: renewed", capacity: &fakeCapacity{resp: short}, existingAge: time.Hour,
			wantMessage: noRoom, wantHost: thisNode, wantCount: 2, wantCreates: 1, wantUpdates: 1,
		},
		{
			name: "still untaken RefreshInterval later: renewed", capacity: &fakeCapacity{resp: short}, later: true,
			wantMessage: noRoom, wantHost: thisNode, wantCount: 2, wantCreates: 2, wantUpdates: 1,
		},
		{
			name: "the class's allowedTopologies exclude this node, no node takes it", class: newClass().AllowedTopology(keyZone, "no-such-zone").Obj(),
			graceStep:   4 * maxDelay,
			wantMessage: "no node took the claim within 1m20s: storage class sc does not allow node n9: ",
			wantHost:    thisNode, wantCount: 1, wantCreates: 1,
		},
		{
			name: "the class's allowedTopologies exclude this node, another node takes it within the grace period", class: newClass().AllowedTopology(keyZone, "a").Obj(),
			graceStep: 4 * maxDelay,
			afterDecline: func(t *testing.T, h *harness) {
				h.selectNode(t, "c", "n1")
			},
		},
		{
			name: "immediate binding off: at once", immediateOff: true,
			wantMessage: immediateOff, wantHost: thisNode, wantCount: 1, wantCreates: 1,
		},
		{
			name: "immediate binding off, RefreshInterval later: renewed", immediateOff: true, later: true,
			wantMessage: immediateOff, wantHost: thisNode, wantCount: 2, wantCreates: 2, wantUpdates: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			nd := testNodeDeployment(func(nd *NodeDeployment) {
				nd.BaseDelay, nd.MaxDelay, nd.ImmediateBinding = baseDelay, maxDelay, !tt.immediateOff
			})
			if tt.capacity != nil {
				nd.GetCapacity = tt.capacity.get
			}
			claim := newClaim("c").Obj()
			class := tt.class
			if class == nil {
				class = newClass().Obj()
			}
			objs := append(cluster(), claim, class)
			if tt.existingAge > 0 {
				at := metav1.NewTime(clk.Now().Add(-tt.existingAge))
				objs = append(objs, &corev1.Event{
					ObjectMeta: metav1.ObjectMeta{Name: "uid-c" + untakenEventSuffix, Namespace: testNS},
					Reason:     reasonProvisioningFailed, Message: "from n1", Source: corev1.EventSource{Host: "n1"},
					FirstTimestamp: at, LastTimestamp: at, Count: 1,
				})
			}
			h := newHarness(t, topologyCaps(), objs, WithNodeDeployment(nd), WithClock(clk))
			// Upstream's ClusterRole, which the chart keeps, has no get
			// on events.
			h.client.PrependReactor("get", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(corev1.Resource("events"), "", errors.New("no get in the ClusterRole"))
			})
			// Each sync gets a context that ends with it, as the library's
			// does with its ProvisionTimeout option: the explanation
			// after the grace period must not depend on it.
			sync := func() {
				t.Helper()
				ctx, cancel := context.WithCancel(h.ctx)
				defer cancel()
				res := make(chan provisionResult, 1)
				go func() {
					if h.p.ShouldProvision(ctx, claim) {
						res <- provisionResult{err: errors.New("ShouldProvision = true")}
					}
					res <- provisionResult{}
				}()
				// One step passes any delay; the grace period's timer,
				// started as the sync returns, is not moved.
				if got := drive(t, clk, res, func() {}, 2*maxDelay, 1); got.err != nil {
					t.Fatal(got.err)
				}
			}
			writesOf := func(verb string) int { return countOf(h.writes(), verb+" events") }

			// Two syncs of the claim, as the library's retries: the
			// second neither explains again nor starts a second wait.
			sync()
			if tt.afterDecline != nil {
				tt.afterDecline(t, h)
			}
			if tt.graceStep > 0 {
				clk.Step(3 * maxDelay)
				if tt.afterDecline == nil && !clk.HasWaiters() {
					t.Error("the excluded node's wait ended by 3 × maxDelay, before an allowed node's capacity explanation")
				}
				clk.Step(tt.graceStep - 3*maxDelay)
			} else {
				clk.Step(grace)
			}
			sync()
			if clk.HasWaiters() {
				t.Error("the second sync started a second wait")
			}
			if tt.wantMessage == "" {
				testutil.Eventually(t, 0, "the claim forgotten once taken", func(context.Context) (bool, error) {
					return !h.p.node.untaken.has(claim.UID), nil
				})
			} else {
				testutil.Eventually(t, 0, "this node's explanation", func(context.Context) (bool, error) {
					return writesOf("create") >= 1, nil
				})
			}
			if tt.later {
				clk.Step(events.RefreshInterval)
				sync()
			}
			testutil.Eventually(t, 0, "this node's event writes", func(context.Context) (bool, error) {
				return writesOf("create") >= tt.wantCreates && writesOf("update") >= tt.wantUpdates, nil
			})
			if c, u := writesOf("create"), writesOf("update"); c != tt.wantCreates || u != tt.wantUpdates {
				t.Errorf("event creates, updates = %d, %d (%q); want %d, %d", c, u, h.writes(), tt.wantCreates, tt.wantUpdates)
			}
			list, err := h.client.CoreV1().Events(testNS).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantMessage == "" {
				if len(list.Items) != 0 {
					t.Errorf("events = %v, want none", list.Items)
				}
				return
			}
			if len(list.Items) != 1 {
				t.Fatalf("events = %v, want one", list.Items)
			}
			ev := list.Items[0]
			if ev.Name != "uid-c"+untakenEventSuffix || ev.Reason != reasonProvisioningFailed || ev.Source.Host != tt.wantHost ||
				!strings.HasPrefix(ev.Message, tt.wantMessage) || ev.Count != tt.wantCount {
				t.Errorf("event %s: %s %q from %q, count %d; want %s %q... from %q, count %d",
					ev.Name, ev.Reason, ev.Message, ev.Source.Host, ev.Count, reasonProvisioningFailed, tt.wantMessage, tt.wantHost, tt.wantCount)
			}
			if tt.existingAge == 0 && (ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != claim.UID || ev.InvolvedObject.Name != "c" ||
				ev.InvolvedObject.Kind != "PersistentVolumeClaim" || ev.Source.Component != EventSourceComponent) {
				t.Errorf("event = %+v, want a Warning about claim c from %s", ev, EventSourceComponent)
			}
			if events := h.events(); len(events) > 0 {
				t.Errorf("recorder events = %q, want none (the explanation is written directly)", events)
			}
		})
	}
}

// TestNodeDeploymentExplainUntakenTakenHere checks that a node that declined
// a claim for capacity and then took it itself within the grace period (a
// volume of its own was deleted meanwhile) does not post "no node took the
// claim" for the claim it is provisioning: the grace period's check sees
// the claim selected for this node, not taken by nobody.
func TestNodeDeploymentExplainUntakenTakenHere(t *testing.T) {
	const (
		baseDelay = 10 * time.Second
		maxDelay  = 20 * time.Second
		grace     = 30 * time.Second
	)
	clk := clocktesting.NewFakeClock(time.Now())
	nd := testNodeDeployment(func(nd *NodeDeployment) { nd.BaseDelay, nd.MaxDelay = baseDelay, maxDelay })
	nd.GetCapacity = (&fakeCapacity{resp: &csi.GetCapacityResponse{AvailableCapacity: gi - 1}}).get
	claim := newClaim("c").Obj()
	h := newHarness(t, topologyCaps(), append(cluster(), claim, newClass().Obj()), WithNodeDeployment(nd), WithClock(clk))

	res := make(chan provisionResult, 1)
	go func() {
		if h.p.ShouldProvision(h.ctx, claim) {
			res <- provisionResult{err: errors.New("ShouldProvision = true")}
		}
		res <- provisionResult{}
	}()
	if got := drive(t, clk, res, func() {}, 2*maxDelay, 1); got.err != nil {
		t.Fatal(got.err)
	}
	if !h.p.node.untaken.has(claim.UID) {
		t.Fatal("the decline is not recorded")
	}
	// This node takes the claim (its write arrives) and is provisioning it
	// when the grace period ends.
	h.selectNode(t, "c", thisNode)
	clk.Step(grace)
	testutil.Eventually(t, 0, "the grace period's check", func(context.Context) (bool, error) {
		return !h.p.node.untaken.has(claim.UID) || countOf(h.writes(), "create events") > 0, nil
	})
	if creates := countOf(h.writes(), "create events"); creates != 0 {
		t.Errorf("event creates = %d (%q), want none: this node took the claim", creates, h.writes())
	}
}

// TestRequeueFreedCapacity covers volumeDeleted: when a PV of this node's
// driver on this node goes, the claims this node declined for capacity
// that may fit now (request at most the room reported then plus the
// volume's size, or room unknown) are handed back to the library; nothing
// else is.
func TestRequeueFreedCapacity(t *testing.T) {
	pv := func() *testutil.PVBuilder { return testutil.NewPV("pv", testDriver).Size("1Gi") }
	claims := []runtime.Object{
		newClaim("short").Obj(),
		newClaim("too-big").Obj(),
		newClaim("bound-since").VolumeName("pv-x").Obj(),
		newClaim("immediate-off").Obj(),
		newClaim("recreated").UID("uid-new").Obj(),
	}
	// What this node declined, as its ShouldProvision records it: claims
	// declined for capacity (one fits with 1Gi more, one does not, one
	// bound since, one deleted and created again), and one declined
	// because immediate binding was off.
	declined := map[string]*capacityDecline{
		"short":         {requested: gi, room: gi / 2},
		"too-big":       {requested: 10 * gi, room: gi},
		"bound-since":   {requested: gi, room: 0},
		"recreated":     {requested: gi, room: 0},
		"immediate-off": nil,
	}
	record := func(h *harness) {
		for name, d := range declined {
			h.p.node.untaken.add(newClaim(name).Obj(), d)
		}
	}
	mine := []string{"short"}
	tests := []struct {
		name    string
		deleted interface{}
		want    []string
	}{
		{"a volume of this node", pv().NodeAffinity(keyZone, "z9").Obj(), mine},
		{"seen as a tombstone", cache.DeletedFinalStateUnknown{Key: "pv", Obj: pv().NodeAffinity(keyZone, "z9").Obj()}, mine},
		{"a smaller volume of this node", pv().Size("100Mi").NodeAffinity(keyZone, "z9").Obj(), nil},
		{"a volume of another node", pv().NodeAffinity(keyZone, "a").Obj(), nil},
		{"a volume without node affinity", pv().Obj(), nil},
		{"a volume of another driver", testutil.NewPV("pv", "other.example.com").NodeAffinity(keyZone, "z9").Obj(), nil},
		{"not a CSI volume", pv().NodeAffinity(keyZone, "z9").NotCSI().Obj(), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nd := testNodeDeployment()
			nd.GetCapacity = (&fakeCapacity{resp: &csi.GetCapacityResponse{}}).get
			h := newHarness(t, topologyCaps(), append(cluster(), claims...), WithNodeDeployment(nd))
			lib := libraryOn(t, h.p)
			record(h)
			h.p.volumeDeleted(tt.deleted)
			if got := lib.names(); !slices.Equal(got, tt.want) {
				t.Errorf("queued %v, want %v", got, tt.want)
			}
		})
	}
	// A claim declined again keeps the last decline's numbers.
	t.Run("declined again", func(t *testing.T) {
		var u untaken
		c := newClaim("c").Obj()
		if !u.add(c, &capacityDecline{requested: gi, room: 0}) || u.add(c, &capacityDecline{requested: gi, room: gi / 2}) {
			t.Fatal("add: want new, then not new")
		}
		if got := u.mayFitAfter(gi / 2); len(got) != 1 {
			t.Errorf("after 0.5Gi freed: %v, want the claim (0.5Gi of room at the last decline)", got)
		}
	})
	// Through the informer, as in the sidecar.
	t.Run("informer", func(t *testing.T) {
		nd := testNodeDeployment()
		nd.GetCapacity = (&fakeCapacity{resp: &csi.GetCapacityResponse{}}).get
		h := newHarness(t, topologyCaps(), append(cluster(), claims[0], pv().NodeAffinity(keyZone, "z9").Obj()), WithNodeDeployment(nd))
		lib := libraryOn(t, h.p)
		h.p.node.untaken.add(newClaim("short").Obj(), declined["short"])
		// The fake clientset's watch may start after the informer synced,
		// and never delivers a delete from before it started (it replays
		// only objects that exist): wait until it delivers.
		if _, err := h.client.CoreV1().PersistentVolumes().Create(t.Context(), testutil.NewPV("barrier", "other.example.com").Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "the PV watch delivers", func(context.Context) (bool, error) {
			_, err := h.factory.Core().V1().PersistentVolumes().Lister().Get("barrier")
			return err == nil, nil
		})
		if err := h.client.CoreV1().PersistentVolumes().Delete(t.Context(), "pv", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 0, "the claim queued", func(context.Context) (bool, error) {
			return slices.Equal(lib.names(), []string{"short"}), nil
		})
	})
}

// TestNodeDeploymentExplainUntakenRetried: a post of the untaken-claim
// event that fails (API server down, 5xx) is tried again in the background,
// after untakenRetryBase and then twice as long each time, until it
// succeeds; otherwise the claim would stay Pending unexplained until the
// renewal, events.RefreshInterval later. A claim that another node takes
// meanwhile is not explained.
func TestNodeDeploymentExplainUntakenRetried(t *testing.T) {
	const (
		baseDelay = 10 * time.Second
		maxDelay  = 20 * time.Second
		grace     = 30 * time.Second
	)
	tests := []struct {
		name         string
		immediateOff bool
		failures     int // event creates that fail with 500
		// takenMeanwhile: another node takes the claim after the first
		// failed post.
		takenMeanwhile bool
	}{
		{name: "immediate binding off, one failure", immediateOff: true, failures: 1},
		{name: "immediate binding off, three failures", immediateOff: true, failures: 3},
		{name: "capacity decline, one failure", failures: 1},
		{name: "capacity decline, two failures", failures: 2},
		{name: "immediate binding off, taken meanwhile", immediateOff: true, failures: 1, takenMeanwhile: true},
		{name: "capacity decline, taken meanwhile", failures: 1, takenMeanwhile: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			nd := testNodeDeployment(func(nd *NodeDeployment) {
				nd.BaseDelay, nd.MaxDelay, nd.ImmediateBinding = baseDelay, maxDelay, !tt.immediateOff
			})
			nd.GetCapacity = (&fakeCapacity{resp: &csi.GetCapacityResponse{AvailableCapacity: gi - 1}}).get
			claim := newClaim("c").Obj()
			h := newHarness(t, topologyCaps(), append(cluster(), claim, newClass().Obj()), WithNodeDeployment(nd), WithClock(clk))
			var mu sync.Mutex
			creates := 0
			h.client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				creates++
				if creates <= tt.failures {
					return true, nil, apierrors.NewInternalError(errors.New("etcd unavailable"))
				}
				return false, nil, nil
			})
			createsSoFar := func() int {
				mu.Lock()
				defer mu.Unlock()
				return creates
			}
			res := make(chan provisionResult, 1)
			go func() {
				if h.p.ShouldProvision(h.ctx, claim) {
					res <- provisionResult{err: errors.New("ShouldProvision = true")}
				}
				res <- provisionResult{}
			}()
			if got := drive(t, clk, res, func() {}, 2*maxDelay, 1); got.err != nil {
				t.Fatal(got.err)
			}
			if !tt.immediateOff {
				clk.Step(grace)
			}
			testutil.Eventually(t, 0, "the first post fails", func(context.Context) (bool, error) {
				return createsSoFar() == 1, nil
			})
			// Each failure is followed by a retry, twice as late each time.
			delay := untakenRetryBase
			for i := 2; i <= tt.failures+1; i++ {
				testutil.Eventually(t, 10*time.Second, "a retry waits", func(context.Context) (bool, error) { return clk.HasWaiters(), nil })
				if tt.takenMeanwhile {
					h.selectNode(t, "c", "n1")
					clk.Step(delay)
					// The retry finds the claim taken and forgets it.
					testutil.Eventually(t, 0, "the retry's check", func(context.Context) (bool, error) {
						return !h.p.node.untaken.has(claim.UID), nil
					})
					break
				}
				clk.Step(delay)
				delay *= 2
				testutil.Eventually(t, 0, "the retry", func(context.Context) (bool, error) {
					return createsSoFar() == i, nil
				})
			}
			list, err := h.client.CoreV1().Events(testNS).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tt.takenMeanwhile {
				if c := createsSoFar(); len(list.Items) != 0 || c != 1 || clk.HasWaiters() {
					t.Errorf("events %v after %d creates, waiting %v; want none after the failed one, not waiting: another node took the claim", list.Items, c, clk.HasWaiters())
				}
				return
			}
			want := "uid-c" + untakenEventSuffix
			if len(list.Items) != 1 || list.Items[0].Name != want || list.Items[0].Source.Host != thisNode || list.Items[0].Count != 1 {
				t.Errorf("events = %v, want only %s from %s, count 1", list.Items, want, thisNode)
			}
			if clk.HasWaiters() {
				t.Error("still retrying after the post succeeded")
			}
		})
	}
}

// TestNodeDeploymentExcludedNodeKeepsCapacityReason: node n1, which the
// class allows, explained an Immediate claim (not enough capacity). This
// node, which the class's allowedTopologies exclude, declines at every
// sync without an owner delay, so it renews the claim's event before n1
// does; the renewal keeps n1's reason, the real one, and only counts.
func TestNodeDeploymentExcludedNodeKeepsCapacityReason(t *testing.T) {
	const maxDelay = 20 * time.Second
	const capacityReason = "no node took the claim within 30s: node n1 has not enough capacity: 1 bytes available, 1073741824 requested"
	clk := clocktesting.NewFakeClock(time.Now())
	nd := testNodeDeployment(func(nd *NodeDeployment) {
		nd.BaseDelay, nd.MaxDelay, nd.ImmediateBinding = 10*time.Second, maxDelay, true
	})
	claim := newClaim("c").Obj()
	class := newClass().AllowedTopology(keyZone, "a").Obj() // this node is in z9
	at := metav1.NewTime(clk.Now().Add(-time.Minute))
	existing := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "uid-c" + untakenEventSuffix, Namespace: testNS},
		Reason:     reasonProvisioningFailed, Message: capacityReason, Source: corev1.EventSource{Host: "n1"},
		FirstTimestamp: at, LastTimestamp: at, Count: 1,
	}
	h := newHarness(t, topologyCaps(), append(cluster(), claim, class, existing), WithNodeDeployment(nd), WithClock(clk))
	h.client.PrependReactor("get", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("events"), "", errors.New("no get in the ClusterRole"))
	})
	sync := func() {
		t.Helper()
		if h.p.ShouldProvision(h.ctx, claim) {
			t.Fatal("ShouldProvision = true on an excluded node")
		}
	}
	sync()
	clk.Step(untakenExcludedGraceFactor * maxDelay) // its create meets n1's event
	testutil.Eventually(t, 0, "this node's first explanation", func(context.Context) (bool, error) {
		return countOf(h.writes(), "create events") >= 1, nil
	})
	// Still Pending: the library syncs the claim again RefreshInterval
	// later; the renewal is written in the sync.
	clk.Step(events.RefreshInterval)
	sync()
	list, err := h.client.CoreV1().Events(testNS).List(t.Context(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("events = %v, %v; want one", list, err)
	}
	if ev := list.Items[0]; !strings.HasPrefix(ev.Message, capacityReason) || ev.Source.Host != "n1" || ev.Count != 2 {
		t.Errorf("event %q from %q, count %d; want n1's capacity reason kept, count 2", ev.Message, ev.Source.Host, ev.Count)
	}
}
