package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Process is a child program started by [StartProcess]. It runs in its own
// process group and receives SIGKILL when this program dies.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	// LogPath holds the child's stdout and stderr.
	LogPath string

	done    chan struct{}
	waitErr error
}

// spawner starts children from one goroutine that keeps its OS thread for the
// life of the program. Linux delivers the parent-death signal when the thread
// that forked the child exits, not the process; a thread that never exits makes
// Pdeathsig mean "when this program dies".
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd   *exec.Cmd
	reply chan error
}

func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the program
			for r := range spawner.reqs {
				r.reply <- r.cmd.Start()
			}
		}()
	})
	r := spawnRequest{cmd: cmd, reply: make(chan error, 1)}
	spawner.reqs <- r
	return <-r.reply
}

// StartProcess starts path with args, writing its output to logPath (appended).
// The child gets its own process group and SIGKILL when this program dies, so
// it cannot outlive a test binary that panics or times out.
func StartProcess(name, path string, args []string, env []string, logPath string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log for %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if env != nil {
		cmd.Env = env
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// ExitErr is the result of waiting for the process; valid once Exited is closed.
func (p *Process) ExitErr() error { return p.waitErr }

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(-p.Cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	return nil
}

// Stop sends SIGTERM to the process group, waits up to grace for the process
// to exit, then sends SIGKILL and waits. It is safe to call more than once.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

// Kill sends SIGKILL to the process group and waits for the process to exit.
func (p *Process) Kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done
	return nil
}

// WaitExit waits until the process exits or ctx is done.
func (p *Process) WaitExit(ctx context.Context) error {
	select {
	case <-p.done:
		return p.waitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}
