//go:build !windows

package cli

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
)

// followSize calls resize with the terminal fd's size each time it changes (SIGWINCH), until
// stop is called.
func followSize(fd int, resize func(cols, rows int)) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-winch:
				if cols, rows, err := term.GetSize(fd); err == nil {
					resize(cols, rows)
				}
			}
		}
	}()
	return func() { signal.Stop(winch); close(done) }
}
