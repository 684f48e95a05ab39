// Package driver is a small, real CSI driver for one node: the hostpath
// example that csi-provisioner's integration tests, demo, benchmark and
// chaos tests run, and that storage vendors can read as a model.
//
// It implements the Identity, Controller and Node services of CSI v1.13:
// volumes (mount and block, empty, cloned or restored from a snapshot),
// snapshots, capacity, topology, optional ControllerPublish/Unpublish and
// NodePublish/Unpublish. Data lives in a backend.Backend: directories and
// sparse files under a root directory, or nowhere at all (memory).
//
// # Starting it
//
// The binary in the parent directory parses flags into a Config and calls
// Run. In-process, for tests:
//
//	cfg := driver.DefaultConfig()
//	cfg.NodeID, cfg.Backend = "node-1", driver.BackendMemory
//	d, err := driver.New(ctx, cfg)
//	...
//	defer d.Close()
//	lis, err := driver.Listen(socketPath)
//	...
//	go d.Serve(ctx, lis) // returns after ctx ends and calls in flight finish
//
// # Concurrency
//
// One mutex (Driver.mu) serialises every call that reads or changes the
// driver's state, including the backend work: creating directories,
// copying data for clones and snapshots, mounting. That keeps the code
// obvious and makes every call atomic with respect to every other; a
// production driver would lock per volume and copy data outside the lock.
// Injected latencies and hangs (see Faults) are spent outside the mutex,
// so a slow call does not hold up others. Probe does not take the mutex:
// it answers while a copy runs.
//
// # Durability
//
// Every change is saved by the backend before the call answers: with the
// dir backend, an acknowledged CreateVolume survives SIGKILL and power
// loss, and an acknowledged DeleteVolume stays deleted. A save that fails
// before the new state is on disk undoes the change (INTERNAL). A save
// whose new state is on disk but not known to be durable (the fsync of the
// directory failed) keeps the change and answers UNAVAILABLE; every later
// call saves again before it answers, so the retry acknowledges the change
// only once it is durable.
//
// # Logging
//
// Every call is logged at V(3) with its method, duration and gRPC code;
// requests and responses at V(5), passed through protosanitizer so that
// secrets never reach the log. The driver records the names of the secrets
// that CreateVolume received, never their values.
package driver
