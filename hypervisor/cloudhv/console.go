package cloudhv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// The guest's console: what its kernel prints and whatever guest root writes to /dev/hvc0.
// CH's File mode appends it to a host file without end, so a guest could fill the host's
// disk. In Pty mode CH writes it to a pseudo-terminal, keeps the last 16 KiB that nobody has
// read (vmm/src/serial_buffer.rs, dropping the oldest) and never stalls the guest; the
// driver copies the terminal into the guest dir's console.log (startCopy).
//
// The VMM's own log (its stdout and stderr) needs the same bound: CH logs, at its default
// level (warn), a line for every byte a guest writes to the debug port 0x80
// (devices/src/legacy/debug_port.rs), and prints what it writes to the firmware debug port
// 0x402 (fwdebug.rs). So the VMM writes into a named pipe in the guest dir (vmmPipeFile),
// whose write end is non-blocking, and the driver copies it into vmm.log. When the copy lags,
// or no node runs to read the pipe, CH's write fails and its logger drops the line
// (cloud-hypervisor/src/logger.rs ignores write errors; Rust ignores SIGPIPE) rather than
// stall a vCPU or the VMM's API. (A guest that floods 0x402 past the copy's rate makes CH's
// print! fail, whose panic CH turns into the end of that guest's own VM.) A restarted node
// opens the named pipe again (adoptLogs), which a pipe inherited from the node would not
// allow.
//
// Each copy writes its log up to logMax bytes, then moves it to <log>.1 and starts again. A
// guest's console and VMM log so cost the host at most two of those each on disk, and what
// is kept is the newest: the panic that says why a guest died is its console's last line.
// The copy is the node's work, not the guest's, so it reads at most logBytesPerSec (after a
// burst of logBurst); beyond that the terminal fills and CH drops the oldest, or the pipe
// fills and CH drops the newest, in the VMM, whose CPU is the guest's.
const (
	logMax         = 1 << 20
	logBytesPerSec = 256 << 10
	logBurst       = 1 << 20
	// vmmPipeFile is the named pipe of the VMM's stdout and stderr, copied into vmm.log.
	vmmPipeFile = "vmm.pipe"
)

// logCopy is the copy of one of a guest's outputs (its console's terminal, its VMM's log
// pipe) into a rotating log in the guest dir, served by this process.
type logCopy struct {
	src    *os.File
	cancel context.CancelFunc
	done   chan struct{} // closed when the copy has ended
}

// startConsole reads guest id's console terminal (vm.info's console.file) into its console
// log until the VMM closes it or stopCopy. A console that is not a booted VM's
// pseudo-terminal (a VM not yet booted, or of an earlier driver, whose console was a File)
// has nothing to read.
func (d *Driver) startConsole(ctx context.Context, id string) error {
	vi, err := d.client(id).VMInfo(ctx)
	if err != nil {
		return fmt.Errorf("cloudhv: guest %s: console: %w", id, err)
	}
	con := vi.Config.Console
	if con == nil || con.Mode != consoleMode || con.File == "" {
		return nil
	}
	return d.relayConsole(id, con.File)
}

// relayConsole copies the console terminal at path into guest id's console log.
func (d *Driver) relayConsole(id, path string) error {
	notPty := fmt.Errorf("cloudhv: guest %s: vm.info names console %q, not a pseudo-terminal", id, path)
	if filepath.Dir(filepath.Clean(path)) != "/dev/pts" {
		return notPty
	}
	tty, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOCTTY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("cloudhv: guest %s: console: %w", id, err)
	}
	if fi, err := tty.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		_ = tty.Close()
		return notPty
	}
	d.startCopy(&d.consoles, id, tty, consoleFile)
	return nil
}

// openVMMLogPipe makes guest dir's VMM log pipe anew and answers its read end, for the copy,
// and its write end, for the VMM's stdout and stderr.
func openVMMLogPipe(dir string) (r, w *os.File, err error) {
	p := filepath.Join(dir, vmmPipeFile)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("cloudhv: vmm log pipe: %w", err)
	}
	if err := unix.Mkfifo(p, 0o600); err != nil {
		return nil, nil, fmt.Errorf("cloudhv: vmm log pipe: %w", err)
	}
	if r, err = openLogPipe(p); err != nil {
		return nil, nil, err
	}
	// Opened while a reader is, so at once.
	if w, err = os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0); err != nil {
		_ = r.Close()
		return nil, nil, fmt.Errorf("cloudhv: vmm log pipe: %w", err)
	}
	return r, w, nil
}

// openLogPipe opens the read end of the named pipe at p without waiting for a writer.
func openLogPipe(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("cloudhv: vmm log pipe: %w", err)
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		_ = f.Close()
		return nil, fmt.Errorf("cloudhv: vmm log pipe %s is not a named pipe", p)
	}
	return f, nil
}

// awaitVMMLog waits, at most vmmLogSettle, for the end of the copy of guest id's VMM log: once
// the VMM has exited, its last lines are then in vmm.log.
func (d *Driver) awaitVMMLog(id string) {
	if v, ok := d.vmmLogs.Load(id); ok {
		select {
		case <-v.(*logCopy).done:
		case <-time.After(vmmLogSettle):
		}
	}
}

// vmmLogSettle bounds awaitVMMLog: the copy reads what an exited VMM left in its pipe at once.
const vmmLogSettle = 2 * time.Second

// startCopy copies src into guest id's log file name (a rotatingLog, at most d.copyRate),
// until src ends or stopCopy, in place of the copy that m held for the guest.
func (d *Driver) startCopy(m *sync.Map, id string, src *os.File, name string) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &logCopy{src: src, cancel: cancel, done: make(chan struct{})}
	if old, loaded := m.Swap(id, c); loaded {
		old.(*logCopy).stop()
	}
	var lim *rate.Limiter
	if d.copyRate > 0 {
		lim = rate.NewLimiter(d.copyRate, d.copyBurst)
	}
	go func() {
		defer close(c.done)
		err := copyLog(ctx, &rotatingLog{path: filepath.Join(d.GuestDir(id), name), max: logMax}, src, lim)
		// EOF: the VMM closed the pipe (its end); EOF or EIO: it closed the terminal (the
		// VM's end); a closed file or the context's end: stopCopy.
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EIO) && !errors.Is(err, os.ErrClosed) && ctx.Err() == nil {
			d.log.Warn("guest output: the copy stopped; what follows stays in the VMM or is lost", "id", id, "log", name, "err", err)
		}
	}()
}

// copyLog copies src into log, at most as fast as lim allows (nil: no bound), until either
// fails or ctx ends, and closes both.
func copyLog(ctx context.Context, log *rotatingLog, src *os.File, lim *rate.Limiter) (err error) {
	defer src.Close()
	defer func() { err = errors.Join(err, log.close()) }()
	buf := make([]byte, 32<<10)
	if lim != nil {
		buf = buf[:min(len(buf), max(lim.Burst(), 1))] // WaitN takes at most a burst
	}
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, err := log.Write(buf[:n]); err != nil {
				return err
			}
			if lim != nil {
				if err := lim.WaitN(ctx, n); err != nil {
					return err
				}
			}
		}
		if rerr != nil {
			return rerr
		}
	}
}

func (c *logCopy) stop() {
	c.cancel()
	_ = c.src.Close()
	<-c.done
}

// stopCopy ends the copy that m holds for guest id, if this process serves one.
func stopCopy(m *sync.Map, id string) {
	if v, ok := m.LoadAndDelete(id); ok {
		v.(*logCopy).stop()
	}
}

// stopCopies ends the copies of guest id's console and VMM log.
func (d *Driver) stopCopies(id string) {
	stopCopy(&d.consoles, id)
	stopCopy(&d.vmmLogs, id)
}

// adoptLogs is a (restarted) driver's look at its guests' outputs: a running VMM's log pipe
// and console terminal are read again (the previous process's copies died with it;
// meanwhile the VMM dropped its log lines and kept the console's last 16 KiB). The guests
// are asked for their terminals at once, each for adoptConsoleWait at most: a VMM that does
// not answer must not hold up the node's start. A VMM of an earlier driver, which has no log
// pipe, writes its vmm.log itself.
func (d *Driver) adoptLogs(ctx context.Context) {
	ids, err := d.List(ctx)
	if err != nil {
		d.log.Warn("guest logs after a restart", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		if r, err := d.load(id); err != nil || !r.alive() {
			continue
		}
		if f, err := openLogPipe(filepath.Join(d.GuestDir(id), vmmPipeFile)); err == nil {
			d.startCopy(&d.vmmLogs, id, f, vmmLogFile)
		} else if !errors.Is(err, fs.ErrNotExist) {
			d.log.Warn("guest VMM log after a restart", "id", id, "err", err)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, adoptConsoleWait)
			defer cancel()
			if err := d.startConsole(ctx, id); err != nil {
				d.log.Warn("guest console after a restart", "id", id, "err", err)
			}
		})
	}
	wg.Wait()
}

// adoptConsoleWait bounds a restarted driver's vm.info to one VMM for its console.
const adoptConsoleWait = 5 * time.Second

// rotatingLog writes to path up to max bytes, then moves path to path.1 (replacing it) and
// starts path afresh. It appends to a path that exists (a restarted node's relay).
type rotatingLog struct {
	path string
	max  int64
	f    *os.File
	size int64
}

func (l *rotatingLog) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if l.f == nil {
			f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return n, err
			}
			fi, err := f.Stat()
			if err != nil {
				_ = f.Close()
				return n, err
			}
			l.f, l.size = f, fi.Size()
		}
		if l.size >= l.max {
			if err := l.close(); err != nil {
				return n, err
			}
			if err := os.Rename(l.path, l.path+".1"); err != nil {
				return n, err
			}
			continue
		}
		w, err := l.f.Write(p[:min(int64(len(p)), l.max-l.size)])
		n, l.size, p = n+w, l.size+int64(w), p[w:]
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (l *rotatingLog) close() error {
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// consoleTail is the last n bytes of guest dir's console (console.log, after console.log.1),
// trimmed.
func consoleTail(dir string, n int64) string {
	p := filepath.Join(dir, consoleFile)
	cur := tailBytes(p, n)
	if int64(len(cur)) < n {
		cur = append(tailBytes(p+".1", n-int64(len(cur))), cur...)
	}
	return strings.TrimSpace(string(cur))
}
