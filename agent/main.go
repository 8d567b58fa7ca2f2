package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

const usage = `Usage: wb agent [--socket PATH] [--root DIR] [--log-level LEVEL]

Runs inside a guest (as its init, PID 1) and serves exec, PTY, file and quiesce requests as
HTTP/1.1 on a Unix socket that a bind-mounted host directory exposes to the node. As PID 1 it
also reaps orphaned processes. It stops on SIGTERM or SIGINT.

Flags:
`

// Main is `wb agent`: args are the arguments after "agent". It parses the flags and runs Serve
// until SIGTERM or SIGINT, reaping orphans when it is PID 1. --help prints the usage and returns
// nil.
func Main(args []string) error {
	fs := flag.NewFlagSet("wb agent", flag.ContinueOnError)
	socket := fs.String("socket", "/run/wb/agent.sock", "Unix socket to listen on (its directory is created; a stale socket is replaced)")
	root := fs.String("root", "/workspace", "default working directory of exec and pty, and base of relative file paths (created if missing)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	egressListen := fs.String("egress-listen", "", "guest loopback address (host:port) to relay to the node's egress proxy; empty: no egress")
	egressSocket := fs.String("egress-socket", "/run/wb/egress.sock", "Unix socket of the node's egress proxy")
	pidsMax := fs.Int("pids-max", envInt(PidsMaxEnv), "the guest's process limit: exec and PTY processes start in a pids cgroup of this size (where the agent can mount one), below the sandbox's own limit; 0: none (default $"+PidsMaxEnv+")")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("wb agent: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("wb agent: unexpected argument %q (see wb agent --help)", fs.Arg(0))
	}
	_ = os.Unsetenv(PidsMaxEnv) // the guest's processes have no use for it
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("wb agent: --log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return Serve(ctx, Config{
		Socket: *socket,
		Root:   *root,
		Logger: logger,
		Reap:   os.Getpid() == 1,
		Init:   os.Getpid() == 1,

		PidsMax: *pidsMax,

		EgressListen: *egressListen,
		EgressSocket: *egressSocket,
	})
}

// PidsMaxEnv is the environment variable through which a driver gives the agent its
// --pids-max (the OCI driver does, for runsc guests).
const PidsMaxEnv = "WB_AGENT_PIDS_MAX"

// envInt is the integer in environment variable name, 0 when unset or not a number.
func envInt(name string) int {
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return 0
	}
	return n
}
