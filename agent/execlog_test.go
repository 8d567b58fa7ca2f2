package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// blockingHandler holds every "exec" log record until release is closed.
type blockingHandler struct {
	slog.Handler
	release <-chan struct{}
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h blockingHandler) WithGroup(string) slog.Handler { return h }

func (h blockingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "exec" {
		select {
		case <-h.release:
		case <-time.After(20 * time.Second):
		}
	}
	return nil
}

// TestExecResultBeforeLog: the exec's result reaches the client before the agent logs the
// exec (a console write, slow under gVisor, that the caller need not wait for).
func TestExecResultBeforeLog(t *testing.T) {
	t.Parallel()
	dir, err := os.MkdirTemp("", "wba")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	release := make(chan struct{})
	cfg := Config{
		Socket: filepath.Join(dir, "agent.sock"),
		Root:   filepath.Join(dir, "root"),
		Logger: slog.New(blockingHandler{Handler: slog.DiscardHandler, release: release}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, cfg) }()
	c := NewClient(cfg.Socket)
	t.Cleanup(func() {
		c.Close()
		cancel()
		<-done
	})
	waitHealthy(t, c, 30*time.Second)
	ectx, ecancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ecancel()
	res, err := c.Exec(ectx, ExecRequest{Argv: []string{"true"}}, nil)
	close(release)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec true = %+v, %v: the result waited for the log", res, err)
	}
}
