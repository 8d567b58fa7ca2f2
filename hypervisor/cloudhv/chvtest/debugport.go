package chvtest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// DebugPort is where the fake's guest writes what a VM's guest writes to the I/O port 0x80
// (outb): a named pipe, each byte one write to the port.
const DebugPort = "/run/ioport-0x80"

// debugPort is the VM's debug port 0x80 (devices/src/legacy/debug_port.rs): CH logs every
// byte written to it as a warning, with the byte's range name and the time since the VMM
// started, at its default log level; a guest can so make the VMM log without end.
type debugPort struct {
	f     *os.File
	log   *slog.Logger
	start time.Time
	done  chan struct{}
}

// makeDebugPort makes the debug port's pipe in the guest's /run (runDir), where guest root
// (another uid under runc's user namespace) may write it.
func makeDebugPort(runDir string) error {
	p := filepath.Join(runDir, filepath.Base(DebugPort))
	if err := unix.Mkfifo(p, 0o600); err != nil {
		return fmt.Errorf("debug port: %w", err)
	}
	return os.Chmod(p, 0o622)
}

// openDebugPort reads the guest's writes to the debug port in runDir until close.
func openDebugPort(runDir string, log *slog.Logger, start time.Time) (*debugPort, error) {
	// Read and write: the pipe never reads as ended when a guest's writer closes it.
	f, err := os.OpenFile(filepath.Join(runDir, filepath.Base(DebugPort)), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("debug port: %w", err)
	}
	p := &debugPort{f: f, log: log, start: start, done: make(chan struct{})}
	go p.serve()
	return p, nil
}

func (p *debugPort) serve() {
	defer close(p.done)
	buf := make([]byte, 4096)
	for {
		n, err := p.f.Read(buf)
		for _, code := range buf[:n] {
			el := time.Since(p.start)
			// CH's words and numbers, {:>06} of the elapsed microseconds included.
			p.log.Warn(fmt.Sprintf("[Debug I/O port: %s code 0x%x] %d.%06d seconds", debugPortRange(code), code, int64(el.Seconds()), el.Microseconds()))
		}
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				p.log.Warn("debug port", "err", err)
			}
			return
		}
	}
}

func (p *debugPort) close() {
	_ = p.f.Close()
	<-p.done
}

// debugPortRange is DebugIoPortRange::from_u8's name of code.
func debugPortRange(code byte) string {
	switch {
	case code < 0x20:
		return "Firmware"
	case code < 0x40:
		return "Bootloader"
	case code < 0x60:
		return "Kernel"
	case code < 0x80:
		return "Userspace"
	}
	return "Custom"
}
