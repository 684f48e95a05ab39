// Package sanity runs the csi-test v5 sanity suite (pkg/sanity) against
// the hostpath example driver, in-process over a unix socket, for each
// backend and a few flag combinations. It has no code outside its tests.
//
// Ginkgo allows one RunSpecs per process, so TestSanity runs each
// combination as a subprocess of the test binary (TestSanitySuite, which
// skips itself when run directly), reads the subprocess's Ginkgo JSON
// report and logs the passed, failed, pending and skipped counts and
// every skipped spec with its reason:
//
//	go test ./examples/hostpath-driver/... -run Sanity -v
//
// Add -args -sanity.list-skipped to list every skipped spec and its reason.
package sanity
