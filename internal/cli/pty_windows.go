package cli

import (
	"time"

	"golang.org/x/term"
)

// sizePoll is how often the console's size is read: Windows has no SIGWINCH, and its resize
// events arrive among the console's input records, which the reads of stdin consume.
const sizePoll = 250 * time.Millisecond

// followSize calls resize with the console fd's size each time it changes, until stop is
// called.
func followSize(fd int, resize func(cols, rows int)) (stop func()) {
	cols, rows, _ := term.GetSize(fd) // the size the terminal was opened with
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(sizePoll)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				c, r, err := term.GetSize(fd)
				if err != nil || (c == cols && r == rows) {
					continue
				}
				cols, rows = c, r
				resize(cols, rows)
			}
		}
	}()
	return func() { close(done) }
}
