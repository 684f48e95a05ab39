package main

import (
	"bytes"
	"log"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// TestStandardLogGoesThroughKlog: a line written with the standard log
// package (net/http's server errors use it) comes out of klog's logger,
// naming its caller, not as a bare line of its own.
func TestStandardLogGoesThroughKlog(t *testing.T) {
	var out bytes.Buffer
	// An earlier test's logsapi.ResetForTest started klog's flush daemon,
	// which reads the logger SetLogger writes: stop it first, as main sets
	// the logger before anything logs.
	klog.StopFlushDaemon()
	klog.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&out))))
	t.Cleanup(func() {
		klog.ClearLogger()
		log.SetOutput(os.Stderr)
		log.SetFlags(log.LstdFlags)
	})

	routeStandardLog()
	log.Print("http: Accept error: too many open files")
	log.Printf("http: %s", "superfluous response.WriteHeader call")

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("klog's output %q: want two lines", out.String())
	}
	for i, want := range []string{"http: Accept error: too many open files", "http: superfluous response.WriteHeader call"} {
		if !strings.HasPrefix(lines[i], "I") || !strings.Contains(lines[i], "main_test.go:") || !strings.Contains(lines[i], want) {
			t.Errorf("line %q: want a klog info line from main_test.go with %q", lines[i], want)
		}
	}
}

// TestStopOnSignal: the first signal ends the context, and only the second
// one calls exit.
func TestStopOnSignal(t *testing.T) {
	signals := make(chan os.Signal)
	exited := make(chan struct{})
	ctx := stopOnSignal(t.Context(), signals, func() { close(exited) })
	signals <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the first signal did not end the context")
	}
	select {
	case <-exited:
		t.Fatal("the first signal exited")
	default:
	}
	signals <- syscall.SIGINT // taken only once the first is handled
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("the second signal did not exit")
	}
}
