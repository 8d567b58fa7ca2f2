//go:build !linux

package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
)

// peekZombie is Linux-only; elsewhere the reaper does nothing.
func peekZombie() (int, error) {
	return 0, errors.New("agent: reaping is supported on Linux only")
}

// childCgroup is Linux-only; elsewhere children start where the agent runs.
type childCgroup struct{}

func setupChildCgroup(_ context.Context, _ *slog.Logger, _ int, _ bool) *childCgroup { return nil }

func (c *childCgroup) startIn(startFn func() (int, error)) (int, error) { return startFn() }

func dropSysAdmin() error { return nil }

func undumpable() error { return nil }

func (c *childCgroup) endAll() int { return 0 }

func (c *childCgroup) guard(_ context.Context, _ *slog.Logger, _ func() int, _ <-chan struct{}) {}

// outputPipe is os.Pipe elsewhere (procs_linux.go says why Linux differs).
func outputPipe() (r, w *os.File, err error) { return os.Pipe() }

// inputPipe is os.Pipe elsewhere (procs_linux.go says why Linux differs).
func inputPipe() (r, w *os.File, err error) { return os.Pipe() }

func openDevNull() (*os.File, error) { return os.Open(os.DevNull) }
