package controlplane

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFreePortBelowEphemeralRange checks that the ports handed out are
// bindable and, where the kernel's range is readable, outside the range that
// outgoing connections draw from.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	lo, hi, ok := belowEphemeral()
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if ok && (port < lo || port >= hi) {
			t.Errorf("port %d outside [%d, %d)", port, lo, hi)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d: %v", port, err)
		}
		_ = l.Close()
	}
}

func TestStartOnFreePorts(t *testing.T) {
	clash := "listen tcp 127.0.0.1:4242: bind: address already in use\n"
	errStart := errors.New("not ready")
	tests := []struct {
		name string
		// logs[i] is what attempt i writes before failing; attempts past
		// the end succeed.
		logs         []string
		wantAttempts int
		wantErr      bool
	}{
		{name: "first attempt", wantAttempts: 1},
		{name: "clash then success", logs: []string{clash}, wantAttempts: 2},
		{name: "two clashes then success", logs: []string{clash, "other line\n" + clash}, wantAttempts: 3},
		{name: "other failure is not retried", logs: []string{"flag provided but not defined\n"}, wantAttempts: 1, wantErr: true},
		// The first attempt's clash stays in the log; the second failure is
		// judged by what it wrote itself.
		{name: "earlier clash does not count", logs: []string{clash, "bad flag\n"}, wantAttempts: 2, wantErr: true},
		{name: "clashes bounded", logs: []string{clash, clash, clash, clash, clash, clash, clash}, wantAttempts: portAttempts, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "server.log")
			attempts := 0
			err := startOnFreePorts(logPath, func() (*Process, error) {
				attempts++
				if attempts > len(tt.logs) {
					return nil, nil
				}
				f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = f.WriteString(tt.logs[attempts-1])
				_ = f.Close()
				return nil, errStart
			})
			if attempts != tt.wantAttempts {
				t.Errorf("attempts = %d, want %d", attempts, tt.wantAttempts)
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, errStart) {
				t.Errorf("err = %v, does not wrap the attempt's error", err)
			}
		})
	}
}

// TestStartRetriesTakenPort starts a control plane whose first etcd client
// port and first kube-apiserver port are held by a listener, as when another
// process binds a port between FreePort and the server's start: both servers
// fail with "address already in use", get new ports, and the control plane
// serves.
func TestStartRetriesTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	calls := 0
	pick := func() (int, error) {
		calls++
		// 1: etcd's client port; 5: kube-apiserver's port after etcd's
		// second attempt took 3 and 4.
		if calls == 1 || calls == 5 {
			return takenPort, nil
		}
		return FreePort()
	}
	cp := StartForTest(t, Config{Controllers: []string{}, pickPort: pick})
	if calls != 6 {
		t.Errorf("ports picked: %d, want 6 (two attempts each)", calls)
	}
	for _, log := range []string{"etcd.log", "kube-apiserver.log"} {
		if !portClash(filepath.Join(cp.Dir, log), 0) {
			t.Errorf("%s does not show the clash; the test did not exercise the retry", log)
		}
	}
	if _, err := cp.Client().CoreV1().Namespaces().Create(t.Context(), nsObj.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("control plane does not serve after the retries: %v", err)
	}
}
