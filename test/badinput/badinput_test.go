package badinput

import (
	"testing"
)

// TestBadInput runs the catalogue: every row is a bad input and its exact
// expected outcome. Rows through the API server share one driver (with
// --max-volume-size=1Gi) and one sidecar; each row checks that the driver
// lost no volume and gained only the ones the row expects. Process rows run
// the sidecar binary with bad flags or endpoints.
func TestBadInput(t *testing.T) {
	s := newStack(t, "badinput", []string{"--max-volume-size=1Gi"}, []string{"-v=4", "--timeout=10s"})
	for _, row := range apiRows() {
		t.Run("api/"+row.name, func(t *testing.T) { s.runAPIRow(t, row) })
	}
	for _, row := range processRows() {
		t.Run("process/"+row.name, func(t *testing.T) { runProcessRow(t, s.bins.Sidecar, s.cp.KubeconfigPath, row) })
	}
}
