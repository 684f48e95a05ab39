package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kube-storage/csi-provisioner/internal/controlplane"
	"github.com/kube-storage/csi-provisioner/internal/e2e"
)

// TestLeadership checks how the identity a process led with is read from
// its log, with lines from a real run: the process's own "New leader
// detected" line comes right after or right before "Successfully acquired
// lease"; an older line names the previous leader (the process was killed
// before it logged its own), and then the identity is unknown.
func TestLeadership(t *testing.T) {
	const (
		prev     = `I1123 11:28:01.341312   13592 leader_election.go:210] "New leader detected" leader="vm-prev"`
		acquired = `I1123 11:28:06.378962   13592 leaderelection.go:272] "Successfully acquired lease" lock="l"`
		ownAfter = `I1123 11:28:06.379179   13592 leader_election.go:210] "New leader detected" leader="vm-own"`
		ownJust  = `I1123 11:28:06.378900   13592 leader_election.go:210] "New leader detected" leader="vm-own"`
	)
	tests := []struct {
		name  string
		lines []string
		want  string
	}{
		{"own line after the acquisition", []string{prev, acquired, ownAfter}, "vm-own"},
		{"own line just before it", []string{prev, ownJust, acquired}, "vm-own"},
		{"killed before its own line: unknown, not the previous leader", []string{prev, acquired}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sidecar.log")
			if err := os.WriteFile(path, []byte(strings.Join(tt.lines, "\n")+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			r := &replica{sc: &e2e.Sidecar{Process: &controlplane.Process{LogPath: path}}}
			if acq, id := r.leadership(); !acq || id != tt.want {
				t.Errorf("leadership() = %v, %q; want true, %q", acq, id, tt.want)
			}
		})
	}
}
