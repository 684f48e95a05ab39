package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// procUsage is what Linux reports of a process's CPU and memory.
type procUsage struct {
	CPU       time.Duration // user + system
	RSS       int64         // bytes, now
	PeakRSS   int64         // bytes, high-water mark (VmHWM)
	Anon      int64         // bytes of RSS that are anonymous memory (heap, stacks), now
	File      int64         // bytes of RSS that are pages of mapped files (the binary), now
	Threads   int
	Available bool
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// readProc reads /proc/<pid>/stat and /proc/<pid>/status.
func readProc(pid int) (procUsage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procUsage{}, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	// fields[0] is field 3 (state); utime is field 14, stime field 15.
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	u := procUsage{CPU: time.Duration(utime+stime) * time.Second / clockTicks, Available: true}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			u.RSS = n * 1024
		case "VmHWM":
			u.PeakRSS = n * 1024
		case "Threads":
			u.Threads = int(n)
		case "RssAnon":
			u.Anon = n * 1024
		case "RssFile":
			u.File = n * 1024
		}
	}
	return u, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// anonSampler records the highest anonymous RSS of a process, sampled every
// 100ms; Linux keeps a high-water mark for the whole RSS only.
type anonSampler struct {
	mu   sync.Mutex
	peak int64
	file int64
	stop chan struct{}
	done chan struct{}
}

func sampleAnon(pid int) *anonSampler {
	s := &anonSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if u, err := readProc(pid); err == nil {
				s.mu.Lock()
				s.peak = max(s.peak, u.Anon)
				s.file = max(s.file, u.File)
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// peaks returns the highest anonymous and file-backed RSS seen so far.
func (s *anonSampler) peaks() (anon, file int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak, s.file
}

func (s *anonSampler) close() {
	close(s.stop)
	<-s.done
}
