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
// The VMM's own log (its stdout and stderr) and its event monitor need the same bound. CH
// logs, at its default level (warn), a line for every byte a guest writes to the debug port
// 0x80 (devices/src/legacy/debug_port.rs), and prints what it writes to the firmware debug
// port 0x402 (fwdebug.rs); it emits an event for every write to the pvpanic device
// (devices/src/pvpanic.rs) and for every reset and activation of a virtio device, which
// guest root can repeat by unbinding and binding its driver. So the VMM writes each into a
// named pipe in the guest dir (vmmPipeFile, eventsPipeFile), non-blocking, and the driver
// copies them into vmm.log and events. When a copy lags, or no node runs to read the pipe,
// CH's write fails and it drops the line or the event (cloud-hypervisor/src/logger.rs and
// vmm/src/lib.rs's event-monitor thread ignore write errors; Rust ignores SIGPIPE) rather
// than stall a vCPU or the VMM's API. (A guest that floods 0x402 past the copy's rate makes
// CH's print! fail, whose panic CH turns into the end of that guest's own VM.) A restarted
// node opens the named pipes again (adoptLogs), which pipes inherited from the node would not
// allow. An event dropped while no node runs is not the guest's end lost: a VMM's exit is
// seen from its process, and a hung or panicked guest from its agent (KnownRunning).
//
// The console and the VMM log are written up to logMax bytes, then moved to <log>.1 and
// started again. They so cost the host at most two of those each on disk, and what is kept
// is the newest: the panic that says why a guest died is its console's last line. The event
// log is read from its start (Events), so it is not moved: past eventsMax its copy drops
// what follows, far more events than a guest's life makes. The copies are the node's work,
// not the guest's, so each reads at most logBytesPerSec (after a burst of logBurst); beyond
// that the terminal fills and CH drops the oldest, or a pipe fills and CH drops the newest,
// in the VMM, whose CPU is the guest's.
const (
	logMax         = 1 << 20
	eventsMax      = 1 << 20
	logBytesPerSec = 256 << 10
	logBurst       = 1 << 20
	// vmmPipeFile is the named pipe of the VMM's stdout and stderr, copied into vmm.log;
	// eventsPipeFile its event monitor's (fd 3), copied into events.
	vmmPipeFile    = "vmm.pipe"
	eventsPipeFile = "events.pipe"
)

// copyKey names one of the copies this process serves: guest id's log file name.
type copyKey struct{ id, name string }

// logCopy is the copy of one of a guest's outputs (its console's terminal, its VMM's log or
// event pipe) into a log in the guest dir, served by this process.
type logCopy struct {
	src    *os.File
	cancel context.CancelFunc
	done   chan struct{} // closed when the copy has ended
}

// startConsole reads guest id's console terminal (vm.info's console.file) into its console
// log until the VMM closes it or stopCopies. A console that is not a booted VM's
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
	d.startCopy(id, consoleFile, tty)
	return nil
}

// pipeCopies are the named pipes of a VMM and the logs they are copied into.
var pipeCopies = []struct{ pipe, log string }{{vmmPipeFile, vmmLogFile}, {eventsPipeFile, eventsFile}}

// openPipes makes guest dir's named pipes anew (pipeCopies), has d copy each from its read end
// and answers their write ends, for the VMM, in pipeCopies' order.
func (d *Driver) openPipes(id string) (w []*os.File, err error) {
	dir := d.GuestDir(id)
	defer func() {
		if err != nil {
			for _, f := range w {
				_ = f.Close()
			}
			w = nil
		}
	}()
	for _, pc := range pipeCopies {
		p := filepath.Join(dir, pc.pipe)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return w, fmt.Errorf("cloudhv: %s: %w", pc.pipe, err)
		}
		if err := unix.Mkfifo(p, 0o600); err != nil {
			return w, fmt.Errorf("cloudhv: %s: %w", pc.pipe, err)
		}
		r, err := openPipe(p)
		if err != nil {
			return w, err
		}
		// Opened while a reader is, so at once.
		f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
		if err != nil {
			_ = r.Close()
			return w, fmt.Errorf("cloudhv: %s: %w", pc.pipe, err)
		}
		w = append(w, f)
		// Until the VMM's end (the pipe's: once these write ends are closed, the VMM's are
		// the last), or stopCopies.
		d.startCopy(id, pc.log, r)
	}
	return w, nil
}

// openPipe opens the read end of the named pipe at p without waiting for a writer.
func openPipe(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("cloudhv: %w", err)
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
		_ = f.Close()
		return nil, fmt.Errorf("cloudhv: %s is not a named pipe", p)
	}
	return f, nil
}

// copyDone answers the channel closed when this process's copy of guest id's log name ends;
// nil (never closed) when it serves none.
func (d *Driver) copyDone(id, name string) <-chan struct{} {
	if v, ok := d.copies.Load(copyKey{id, name}); ok {
		return v.(*logCopy).done
	}
	return nil
}

// copying reports whether this process copies guest id's log name and the copy has not
// ended: its writer, the VMM, may still write.
func (d *Driver) copying(id, name string) bool {
	done := d.copyDone(id, name)
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// awaitVMMLog waits, at most vmmLogSettle, for the end of the copy of guest id's VMM log: once
// the VMM has exited, its last lines are then in vmm.log.
func (d *Driver) awaitVMMLog(id string) {
	if done := d.copyDone(id, vmmLogFile); done != nil {
		select {
		case <-done:
		case <-time.After(vmmLogSettle):
		}
	}
}

// vmmLogSettle bounds awaitVMMLog: the copy reads what an exited VMM left in its pipe at once.
const vmmLogSettle = 2 * time.Second

// startCopy copies src into guest id's log file name, at most d.copyRate, until src ends or
// stopCopies, in place of the copy of that log this process served. The event log is capped
// at eventsMax; the others rotate at logMax.
func (d *Driver) startCopy(id, name string, src *os.File) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &logCopy{src: src, cancel: cancel, done: make(chan struct{})}
	if old, loaded := d.copies.Swap(copyKey{id, name}, c); loaded {
		old.(*logCopy).stop()
	}
	var lim *rate.Limiter
	if d.copyRate > 0 {
		lim = rate.NewLimiter(d.copyRate, d.copyBurst)
	}
	log := &rotatingLog{path: filepath.Join(d.GuestDir(id), name), max: logMax}
	if name == eventsFile {
		log.max, log.capped = eventsMax, func() {
			d.log.Warn("guest events: the VMM's event log is full; its later events are dropped (the guest's end is still seen from its VMM's process and its agent)",
				"id", id, "max_bytes", eventsMax)
		}
	}
	go func() {
		defer close(c.done)
		err := copyLog(ctx, log, src, lim)
		// EOF: the VMM closed the pipe (its end); EOF or EIO: it closed the terminal (the
		// VM's end); a closed file or the context's end: stopCopies.
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

// stopCopy ends the copy of guest id's log name, if this process serves one.
func (d *Driver) stopCopy(id, name string) {
	if v, ok := d.copies.LoadAndDelete(copyKey{id, name}); ok {
		v.(*logCopy).stop()
	}
}

// stopCopies ends the copies of guest id's console, VMM log and events.
func (d *Driver) stopCopies(id string) {
	for _, name := range []string{consoleFile, vmmLogFile, eventsFile} {
		d.stopCopy(id, name)
	}
}

// adoptLogs is a (restarted) driver's look at its guests' outputs: a running VMM's pipes
// and console terminal are read again (the previous process's copies died with it;
// meanwhile the VMM dropped what it wrote to its pipes and kept the console's last 16 KiB).
// The guests are asked for their terminals at once, each for adoptConsoleWait at most: a VMM
// that does not answer must not hold up the node's start. A VMM of an earlier driver, which
// has no pipes, writes its vmm.log and events itself.
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
		for _, pc := range pipeCopies {
			if f, err := openPipe(filepath.Join(d.GuestDir(id), pc.pipe)); err == nil {
				d.startCopy(id, pc.log, f)
			} else if !errors.Is(err, fs.ErrNotExist) {
				d.log.Warn("guest VMM pipe after a restart", "id", id, "pipe", pc.pipe, "err", err)
			}
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
// starts path afresh; or, when capped is set, drops what follows and calls capped once. It
// appends to a path that exists (a restarted node's copy).
type rotatingLog struct {
	path   string
	max    int64
	capped func()
	f      *os.File
	size   int64
	full   bool
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
		if l.size >= l.max && l.capped != nil {
			if !l.full {
				l.full = true
				l.capped()
			}
			return n + len(p), nil
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
