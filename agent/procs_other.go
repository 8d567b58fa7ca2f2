//go:build !linux

package agent

import "errors"

// peekZombie is Linux-only; elsewhere the reaper does nothing.
func peekZombie() (int, error) {
	return 0, errors.New("agent: reaping is supported on Linux only")
}
