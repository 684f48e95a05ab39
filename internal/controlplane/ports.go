package controlplane

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// ephemeralRangeFile holds the kernel's range for the local ports of
// outgoing connections.
const ephemeralRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// lowestPort is the bottom of the range FreePort picks from when it can
// stay below the ephemeral range.
const lowestPort = 10240

// FreePort returns a loopback TCP port that nothing listens on now, for a
// server the caller starts next.
//
// The kernel's own choice (port 0) comes from the ephemeral range, which is
// also where every outgoing connection on the machine gets its local port:
// with test packages running side by side, one of their connections can take
// the port before the server binds it (CI saw etcd fail with "address already
// in use" that way). FreePort therefore picks at random below that range,
// where no connection takes a port by itself. Another process picking the
// same port at the same moment stays possible; servers started here retry on
// a clash (see startOnFreePorts).
func FreePort() (int, error) {
	if lo, hi, ok := belowEphemeral(); ok {
		for range 100 {
			port := lo + rand.IntN(hi-lo)
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				continue
			}
			_ = l.Close()
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// belowEphemeral returns the ports from lowestPort up to the start of the
// ephemeral range, if that range can be read and leaves at least 1024 ports.
func belowEphemeral() (lo, hi int, ok bool) {
	b, err := os.ReadFile(ephemeralRangeFile)
	if err != nil {
		return 0, 0, false
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, 0, false
	}
	start, err := strconv.Atoi(fields[0])
	if err != nil || start-lowestPort < 1024 {
		return 0, 0, false
	}
	return lowestPort, start, true
}

// portAttempts bounds the starts of one server whose port another process
// took between FreePort and the server's bind.
const portAttempts = 5

// startOnFreePorts calls start until it succeeds, fails for another reason
// than a port clash, or has tried portAttempts times. start picks its ports,
// starts a process and waits until it is ready; it returns the process, or
// nil if none was started. A clash is "address already in use" in what the
// failed attempt wrote to logPath; the failed process is stopped before the
// next attempt.
func startOnFreePorts(logPath string, start func() (*Process, error)) error {
	for attempt := 1; ; attempt++ {
		offset := fileSize(logPath)
		p, err := start()
		if err == nil {
			return nil
		}
		if p != nil {
			_ = p.Stop(10 * time.Second)
		}
		if attempt == portAttempts || !portClash(logPath, offset) {
			if attempt > 1 {
				return fmt.Errorf("attempt %d: %w", attempt, err)
			}
			return err
		}
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// portClash reports whether the log written after offset says a port was
// taken.
func portClash(logPath string, offset int64) bool {
	f, err := os.Open(logPath)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false
	}
	b, err := io.ReadAll(f)
	return err == nil && bytes.Contains(b, []byte("address already in use"))
}
