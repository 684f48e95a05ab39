package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

var nsObj = corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restart-check"}}

// helperModeEnv selects a way for TestHelperProcess to fail after starting a
// control plane; TestNoProcessLeftAfterFailure runs it as a subprocess.
const helperModeEnv = "CONTROLPLANE_HELPER_MODE"

// TestHelperProcess is not a real test: it starts a control plane, prints its
// directory and then fails the way helperModeEnv says.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperModeEnv)
	if mode == "" {
		t.Skip("helper for TestNoProcessLeftAfterFailure")
	}
	cp := StartForTest(t, Config{Dir: os.Getenv("CONTROLPLANE_HELPER_DIR")})
	fmt.Printf("CONTROLPLANE_DIR=%s\n", cp.Dir)
	switch mode {
	case "fatal":
		t.Fatal("failing on purpose")
	case "panic":
		panic("panicking on purpose")
	case "timeout":
		select {} // the -test.timeout given by the parent ends the process
	case "exit":
		os.Exit(3)
	}
}

// TestNoProcessLeftAfterFailure runs a test binary that starts a control
// plane and then fails, panics, times out or exits, and checks that no etcd,
// kube-apiserver or kube-controller-manager process of that control plane is
// left running.
func TestNoProcessLeftAfterFailure(t *testing.T) {
	if _, err := FindBinaries(); err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	for _, mode := range []string{"fatal", "panic", "timeout", "exit"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"-test.run=^TestHelperProcess$", "-test.v"}
			if mode == "timeout" {
				args = append(args, "-test.timeout=20s")
			}
			cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
			cmd.Env = append(os.Environ(), helperModeEnv+"="+mode, "CONTROLPLANE_HELPER_DIR="+dir)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			if err == nil {
				t.Fatalf("helper in mode %s succeeded; output:\n%s", mode, out.String())
			}
			if !strings.Contains(out.String(), "CONTROLPLANE_DIR="+dir) {
				t.Fatalf("helper did not start a control plane; output:\n%s", out.String())
			}
			waitNoProcessIn(t, dir)
		})
	}
}

// waitNoProcessIn waits until no process has dir in its command line.
func waitNoProcessIn(t *testing.T, dir string) {
	t.Helper()
	var left []string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		left = processesMentioning(dir)
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("processes left running after the test binary ended: %v", left)
	}
}

func processesMentioning(s string) []string {
	entries, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		// Zombies have an empty command line and are not running.
		if bytes.Contains(cmdline, []byte(s)) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}

func TestStartStopRestart(t *testing.T) {
	cp := StartForTest(t, Config{})
	ctx := t.Context()
	v, err := cp.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != cp.Binaries.KubernetesVersion {
		t.Errorf("server version %s, want %s", v.GitVersion, cp.Binaries.KubernetesVersion)
	}
	if _, err := cp.Client().CoreV1().Namespaces().Create(ctx, &nsObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := cp.RestartAPIServer(rctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client().CoreV1().Namespaces().Get(ctx, nsObj.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("namespace lost across an API server restart: %v", err)
	}
	dir := cp.Dir
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	if left := processesMentioning(dir); len(left) != 0 {
		t.Fatalf("processes left after Stop: %v", left)
	}
}
