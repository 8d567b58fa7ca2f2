package chvtest

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	"golang.org/x/term"
)

// ptyConsole is a VM's virtio console in CH's Pty mode (vmm/src/console_devices.rs,
// create_pty): a pseudo-terminal whose subsidiary side, in raw mode, vm.info names as
// console.file for a reader to open, and whose main side takes what the guest writes to its
// console. The VMM holds both until the VM's end.
type ptyConsole struct {
	main, sub *os.File
}

func openPtyConsole() (*ptyConsole, error) {
	main, sub, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("Error creating console device: %w", err)
	}
	if _, err := term.MakeRaw(int(sub.Fd())); err != nil {
		_ = main.Close()
		_ = sub.Close()
		return nil, fmt.Errorf("Error setting pty raw mode: %w", err)
	}
	return &ptyConsole{main: main, sub: sub}, nil
}

// write puts b on the console without ever holding up the caller. CH keeps what no reader
// has taken in a ring of 16 KiB (vmm/src/serial_buffer.rs) and never stalls the guest; the
// fake writes from a goroutine of its own, which a console that nobody reads holds until the
// VM's end.
func (c *ptyConsole) write(b []byte) {
	go func() { _, _ = c.main.Write(b) }()
}

func (c *ptyConsole) close() {
	_ = c.main.Close()
	_ = c.sub.Close()
}
