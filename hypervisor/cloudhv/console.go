package cloudhv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// The guest's console: what its kernel prints and whatever guest root writes to /dev/hvc0.
// CH's File mode appends it to a host file without end, so a guest could fill the host's
// disk. In Pty mode CH writes it to a pseudo-terminal, keeps the last 16 KiB that nobody has
// read (vmm/src/serial_buffer.rs, dropping the oldest) and never stalls the guest; the
// driver reads the terminal into the guest dir's console.log, up to consoleLogMax bytes, then
// moves it to console.log.1 and starts again. A guest's console so costs the host at most
// two of those on disk, and what is kept is the newest: the panic that says why a guest
// died is its console's last line. The copy is the node's work, not the guest's, so it reads
// at most consoleBytesPerSec (after a burst of consoleBurst): beyond that the terminal fills
// and CH drops the oldest, in the VMM, whose CPU is the guest's.
const (
	consoleLogMax      = 1 << 20
	consoleBytesPerSec = 256 << 10
	consoleBurst       = 1 << 20
)

// consoleRelay is the copy of one guest's console terminal into its console log, served by
// this process.
type consoleRelay struct {
	tty    *os.File
	cancel context.CancelFunc
	done   chan struct{} // closed when the copy has ended
}

// startConsole reads guest id's console terminal (vm.info's console.file) into its console
// log until the VMM closes it or stopConsole. A console that is not a booted VM's
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
	ctx, cancel := context.WithCancel(context.Background())
	cr := &consoleRelay{tty: tty, cancel: cancel, done: make(chan struct{})}
	if old, loaded := d.consoles.Swap(id, cr); loaded {
		old.(*consoleRelay).stop()
	}
	var lim *rate.Limiter
	if d.consoleRate > 0 {
		lim = rate.NewLimiter(d.consoleRate, d.consoleBurst)
	}
	go func() {
		defer close(cr.done)
		err := copyConsole(ctx, &rotatingLog{path: filepath.Join(d.GuestDir(id), consoleFile), max: consoleLogMax}, tty, lim)
		// EOF or EIO: the VMM closed the terminal (the VM's end); a closed file or the
		// context's end: stopConsole.
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EIO) && !errors.Is(err, os.ErrClosed) && ctx.Err() == nil {
			d.log.Warn("guest console: the copy stopped; later output stays in the VMM's 16 KiB", "id", id, "err", err)
		}
	}()
	return nil
}

// copyConsole copies tty into log, at most as fast as lim allows (nil: no bound), until
// either fails or ctx ends, and closes both.
func copyConsole(ctx context.Context, log *rotatingLog, tty *os.File, lim *rate.Limiter) (err error) {
	defer tty.Close()
	defer func() { err = errors.Join(err, log.close()) }()
	buf := make([]byte, 32<<10)
	if lim != nil {
		buf = buf[:min(len(buf), max(lim.Burst(), 1))] // WaitN takes at most a burst
	}
	for {
		n, rerr := tty.Read(buf)
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

func (cr *consoleRelay) stop() {
	cr.cancel()
	_ = cr.tty.Close()
	<-cr.done
}

// stopConsole ends guest id's console relay, if this process serves one.
func (d *Driver) stopConsole(id string) {
	if v, ok := d.consoles.LoadAndDelete(id); ok {
		v.(*consoleRelay).stop()
	}
}

// adoptConsoles is a (restarted) driver's look at its guests' consoles: a running VMM's
// terminal is read again (the previous process's relay died with it; meanwhile the VMM kept
// the last 16 KiB). The guests are asked at once, each for adoptConsoleWait at most: a VMM
// that does not answer must not hold up the node's start.
func (d *Driver) adoptConsoles(ctx context.Context) {
	ids, err := d.List(ctx)
	if err != nil {
		d.log.Warn("guest consoles after a restart", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		if r, err := d.load(id); err != nil || !r.alive() {
			continue
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
