// Command fakech is the fake Cloud Hypervisor (package chvtest) as a process, launched the way
// cloud-hypervisor is:
//
//	fakech --api-socket path=<dir>/api.sock --event-monitor fd=3
//
// --api-socket takes path=<p> (or a bare path); --event-monitor takes fd=<n> or path=<p>.
// What only the fake needs comes from the environment (see chvtest's doc.go):
// WB_FAKECH_STATE_DIR, WB_FAKECH_RUNC, WB_FAKECH_LOG.
// It exits 0 after vmm.shutdown, a guest power-off or SIGTERM; 1 on an error; 3 when it sent
// an answer its own checker rejected (a bug of the fake).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"wb/hypervisor/cloudhv/chvtest"
)

// stateDirPrefix names the state dirs fakech makes for itself under the temp dir.
const stateDirPrefix = "fakech-"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fakech:", err)
		var bad badResponses
		if errors.As(err, &bad) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

type badResponses int64

func (b badResponses) Error() string {
	return fmt.Sprintf("%d answers did not match cloud-hypervisor.yaml (see the log): a bug of the fake", int64(b))
}

// droppingWriter writes to fd once per call and answers success whatever the write did, as
// CH's logger does (cloud-hypervisor/src/logger.rs: `let _ = ...write_all`). os.Stderr would
// wait for room in a full non-blocking pipe.
type droppingWriter struct{ fd int }

func (w droppingWriter) Write(p []byte) (int, error) {
	_, _ = syscall.Write(w.fd, p)
	return len(p), nil
}

// option parses CH's "key=value[,key=value]" flag syntax; a value without "=" is bareKey's.
func option(val, bareKey string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(val, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			k, v = bareKey, kv
		}
		out[k] = v
	}
	return out
}

func run(args []string) error {
	var apiSocket, events string
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(args[i], "=")
		if !strings.HasPrefix(name, "--") || name == "--" {
			return fmt.Errorf("unexpected argument %q (want --api-socket path=<p> [--event-monitor fd=<n>|path=<p>])", args[i])
		}
		if !hasVal {
			if i+1 >= len(args) {
				return fmt.Errorf("%s needs a value", name)
			}
			i++
			val = args[i]
		}
		switch name {
		case "--api-socket":
			apiSocket = val
		case "--event-monitor":
			events = val
		default:
			return fmt.Errorf("unknown flag %s: the fake takes --api-socket and --event-monitor only", name)
		}
	}
	if apiSocket == "" {
		return errors.New("--api-socket path=<p> is required")
	}
	sock := option(apiSocket, "path")["path"]
	if sock == "" {
		return fmt.Errorf("--api-socket %q: want path=<p> (fd= is not supported by the fake)", apiSocket)
	}

	// As CH: Rust ignores SIGPIPE, and CH's logger ignores its writes' errors, so that a log
	// whose reader is gone (a pipe, the driver's copy of it) or full loses lines rather than
	// stall or end the VMM.
	signal.Ignore(syscall.SIGPIPE)
	logOut := io.Writer(droppingWriter{fd: 2})
	if p := os.Getenv("WB_FAKECH_LOG"); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("WB_FAKECH_LOG: %w", err)
		}
		defer f.Close()
		logOut = f
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelDebug}))

	var evw io.Writer
	if events != "" {
		o := option(events, "path")
		switch {
		case o["fd"] != "":
			fd, err := strconv.Atoi(o["fd"])
			if err != nil || fd < 0 {
				return fmt.Errorf("--event-monitor fd=%q: want a file descriptor number", o["fd"])
			}
			f := os.NewFile(uintptr(fd), "event-monitor")
			if f == nil {
				return fmt.Errorf("--event-monitor fd=%d: not an open file descriptor", fd)
			}
			defer f.Close()
			evw = f
		case o["path"] != "":
			f, err := os.OpenFile(o["path"], os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return fmt.Errorf("--event-monitor: %w", err)
			}
			defer f.Close()
			evw = f
		default:
			return fmt.Errorf("--event-monitor %q: want fd=<n> or path=<p>", events)
		}
	}

	stateDir := os.Getenv("WB_FAKECH_STATE_DIR")
	if stateDir == "" {
		// A fakech killed with SIGKILL (the tests' VMM crash) cannot remove its dir nor
		// unmount its guest's disks: the next one does.
		chvtest.ReapStale(os.TempDir(), stateDirPrefix, log)
		d, err := os.MkdirTemp("", stateDirPrefix)
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		if err := chvtest.ClaimStateDir(d); err != nil {
			return err
		}
		stateDir = d
	}
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(stateDir, 0o755); err != nil { // runc's guest root must search it
		return err
	}

	v, err := chvtest.New(chvtest.Options{
		APISocket: sock,
		Events:    evw,
		StateDir:  stateDir,
		Runc:      os.Getenv("WB_FAKECH_RUNC"),
		Logger:    log,
		// A process standing in for CH: its guest is accounted to it, as CH's vCPUs are.
		NestCgroup: true,
		JoinTaps:   true,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := v.Serve(ctx); err != nil {
		return err
	}
	if n := v.BadResponses(); n > 0 {
		return badResponses(n)
	}
	return nil
}
