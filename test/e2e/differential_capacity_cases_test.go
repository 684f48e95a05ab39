package e2e

// Segments as capObject shows them: diff-n1's, diff-n2's, the empty one
// of diff-n3 (the driver without topology keys there: an object that
// selects every node, which upstream deletes, see compareCapacity) and the
// one of the Node a step adds.
const (
	segA     = diffRack + "=1," + diffZone + "=a"
	segB     = diffRack + "=2," + diffZone + "=b"
	segAll   = ""
	segAdded = diffRack + "=5," + diffZone + "=e"
)

// objects is a done condition: n objects but those of the empty segment
// (which upstream deletes, see compareCapacity), each with a capacity, and
// those of the segments in capacity with that capacity.
func objects(n int, capacity map[string]string) func([]capObject) bool {
	return func(objs []capObject) bool {
		if len(segmented(objs)) != n {
			return false
		}
		for _, o := range objs {
			if want, ok := capacity[o.segment]; o.capacity == "nil" || ok && o.capacity != want {
				return false
			}
		}
		return true
	}
}

// capGroups are the groups of TestDifferentialCapacity. The poll interval
// is an hour: only events refresh the objects.
func capGroups() []capGroup {
	return []capGroup{
		{
			name:  "wffc",
			flags: []string{"--capacity-ownerref-level=2", "--capacity-poll-interval=1h"},
			steps: []capStep{
				{
					// Objects for the WaitForFirstConsumer classes in
					// each segment, none for the Immediate class; the
					// failing class has none where GetCapacity fails.
					name: "start",
					do: func(r *capRun) {
						r.class("wffc", false, map[string]string{"tier": "gold", "csi.storage.k8s.io/fstype": "xfs"})
						r.class("max", false, map[string]string{paramCapacityMax: "2Gi"})
						r.class("fail", false, map[string]string{paramCapacityFailZone: "b"})
						r.class("immediate", true, nil)
					},
					done: objects(5, nil),
				},
				{
					// A volume on diff-n1: the objects of its segment, of
					// every class, are refreshed.
					name: "volume created",
					do:   func(r *capRun) { r.claim("data", "wffc", "diff-n1") },
					done: objects(5, map[string]string{segA: "9Gi"}),
				},
				{
					name: "volume deleted",
					do:   func(r *capRun) { r.deleteClaim("data") },
					done: objects(5, map[string]string{segA: "10Gi"}),
				},
				{
					// GetCapacity answers again: the retries publish the
					// missing object.
					name: "GetCapacity recovers",
					do:   func(r *capRun) { r.recoverCapacity() },
					done: objects(6, nil),
				},
				{
					name: "class deleted",
					do:   func(r *capRun) { r.deleteClass("max") },
					done: objects(4, nil),
				},
				{
					name: "class added",
					do:   func(r *capRun) { r.class("late", false, nil) },
					done: objects(6, nil),
				},
				{
					name: "node added",
					do:   func(r *capRun) { r.addNode() },
					done: objects(9, nil),
				},
				{
					name: "node removed",
					do:   func(r *capRun) { r.removeNode() },
					done: objects(6, nil),
				},
			},
		},
		{
			// Immediate classes too, and objects without owner.
			name:  "immediate",
			flags: []string{"--capacity-for-immediate-binding", "--capacity-ownerref-level=-1", "--capacity-poll-interval=1h"},
			steps: []capStep{{
				name: "start",
				do: func(r *capRun) {
					r.class("immediate", true, map[string]string{"csi.storage.k8s.io/fstype": "ext4"})
					r.class("wffc", false, map[string]string{paramCapacityMax: "1Gi"})
				},
				done: objects(4, nil),
			}},
		},
	}
}
