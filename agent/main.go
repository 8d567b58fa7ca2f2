package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
)

const usage = `Usage: wb agent [--socket PATH | --vsock-port N] [--root DIR] [--log-level LEVEL]

Runs inside a guest (as its init, PID 1) and serves exec, PTY, file and quiesce requests as
HTTP/1.1 on a Unix socket that a bind-mounted host directory exposes to the node. As PID 1 it
also reaps orphaned processes. It stops on SIGTERM or SIGINT.

In a VM it listens on a vsock port instead (--vsock-port), and as PID 1 there it first sets up
what a container runtime otherwise would: /proc, /sys, /dev, the writable disk (/dev/vdb) at
/workspace, /tmp and /root, the hostname and the loopback interface (each where it can).
` + VsockUnixDirEnv + `=DIR makes it listen on the Unix socket DIR/N.sock instead of vsock port N
(a test VMM without a vsock device sets it).

Flags:
`

// Main is `wb agent`: args are the arguments after "agent". It parses the flags and runs Serve
// until SIGTERM or SIGINT, reaping orphans when it is PID 1. --help prints the usage and returns
// nil.
func Main(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, args)
}

// run is Main until ctx ends.
func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("wb agent", flag.ContinueOnError)
	socket := fs.String("socket", "/run/wb/agent.sock", "Unix socket to listen on (its directory is created; a stale socket is replaced)")
	root := fs.String("root", "/workspace", "default working directory of exec and pty, and base of relative file paths (created if missing)")
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	egressListen := fs.String("egress-listen", "", "guest loopback address (host:port) to relay to the node's egress proxy; empty: no egress")
	egressSocket := fs.String("egress-socket", "/run/wb/egress.sock", "Unix socket of the node's egress proxy")
	vsockPort := fs.Uint("vsock-port", 0, "listen on this AF_VSOCK port (any CID) instead of --socket: the agent of a VM; as PID 1 it also sets up the VM (mounts, writable disk, hostname, lo)")
	procs := fs.Int("gomaxprocs", envInt(GoMaxProcsEnv), "threads that run the agent's goroutines at once (GOMAXPROCS); 0: Go's default, one per CPU (default $"+GoMaxProcsEnv+")")
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
	if *vsockPort > 1<<32-1 {
		return fmt.Errorf("wb agent: --vsock-port %d: must be below 2^32", *vsockPort)
	}
	vsockUnixDir := os.Getenv(VsockUnixDirEnv)
	_ = os.Unsetenv(PidsMaxEnv) // the guest's processes have no use for them
	_ = os.Unsetenv(GoMaxProcsEnv)
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	_ = os.Unsetenv(VsockUnixDirEnv)
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("wb agent: --log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	isInit := os.Getpid() == 1
	var port uint32
	switch {
	case *vsockPort == 0:
	case vsockUnixDir != "":
		*socket = VsockUnixSocket(vsockUnixDir, uint32(*vsockPort))
	default:
		port = uint32(*vsockPort)
	}
	if *vsockPort != 0 && isInit {
		// Only a VM's agent listens on vsock; as its init it has no runtime to set it up.
		setupVM(logger, realVMHost{root: "/"}, VMWritableDisk)
	}
	return Serve(ctx, Config{
		Socket:    *socket,
		VsockPort: port,
		Root:      *root,
		Logger:    logger,
		Reap:      isInit,
		Init:      isInit,

		PidsMax: *pidsMax,

		EgressListen: *egressListen,
		EgressSocket: *egressSocket,
	})
}

// PidsMaxEnv is the environment variable through which a driver gives the agent its
// --pids-max (the OCI driver does, for runsc guests).
const PidsMaxEnv = "WB_AGENT_PIDS_MAX"

// GoMaxProcsEnv is the environment variable through which a driver gives the agent its
// --gomaxprocs (the OCI driver does, for runsc guests: one, see hypervisor/oci).
const GoMaxProcsEnv = "WB_AGENT_GOMAXPROCS"

// envInt is the integer in environment variable name, 0 when unset or not a number.
func envInt(name string) int {
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return 0
	}
	return n
}
