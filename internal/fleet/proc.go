package fleet

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// proc is one process of the fleet, its output in a log file.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startProc runs bin with args and env, its stderr (and its stdout, unless stdout names a
// file of its own) in log. Each process has a process group of its own, so that a Ctrl-C
// at the terminal reaches only the fleet, which then stops them in order; each dies with
// the fleet's process should that die first.
func startProc(bin string, args, env []string, log string, stdout *string) (*proc, error) {
	logf, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child keeps its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	// Files, not pipes: guests must not hold a pipe of ours open.
	cmd.Stdout, cmd.Stderr = logf, logf
	if stdout != nil {
		out, err := os.Create(*stdout)
		if err != nil {
			return nil, err
		}
		defer out.Close()
		cmd.Stdout = out
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the process.
func (p *proc) kill() {
	if !p.exited() {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// stop sends SIGTERM, and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

func (p *proc) tail() string { return tailOf(p.log, 6000) }
