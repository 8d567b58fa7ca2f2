package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"wb/internal/cli"
)

const usage = `wb — control plane and edge gateway for agent sandboxes.

Usage:
  wb <command> [flags]

Commands for callers (the API of $WB_URL with $WB_API_KEY, or a profile; -o json):
  sessions  create, ls, get, exec, pty, pause, resume, snapshot, rm
  pty       an interactive terminal in a session (wb sessions pty)
  runs      run a command in a session, or ephemeral code
  templates ls: the templates and the runtimes (with versions) runs use
  snapshots ls, get, rm
  policies  push, ls, and run a Rego policy's tests locally
  plugins   test a Wasm plugin locally; push, ls, get, rm
  usage     usage and cost per session or end user
  webhooks  create, ls, get, rm endpoints; their deliveries
  desktops  create, ls, get, sleep, wake, stop, start, resize, rm
  completion  print the shell completion script (bash, zsh, fish)
  conformance  check a deployment against every row of the seeds' tables (--long, --run)

Commands for operators (serve, node, fleet, image and agent run on Linux only):
  serve     run the whole platform on this machine (gateway, placer, webhooks, a node)
  node      run guests for a control plane that shares its Redis
  fleet     run a fleet on this machine: Redis Cluster, 3 nodes, 2 gateways
  load      drive the API open-loop at a fixed rate; latency table, errors, leaks (--fleet)
  envoy-bootstrap  print the bootstrap YAML of one Envoy of the fleet
  fleet-certs  mint a throwaway CA and role certificates for mutual TLS inside a fleet
  image     build a Cloud Hypervisor guest image (kernel, initramfs, ext4 rootfs with wb as init)
  agent     run inside a guest: serve exec, PTY and files on a Unix socket
  version   print the version

Run "wb <command> --help" for a command's flags.
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// gcPercent is the GC target of the long-running roles unless $GOGC says otherwise: the heap
// stays small next to these machines' memory, and a lazier collector keeps admission's tail
// latency (policy evaluation allocates per decision) several times lower.
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if limit := memoryLimit(os.Getenv, os.ReadFile); limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	var exit *cli.ExitError // a remote command's exit code (exec, pty, runs)
	if errors.As(err, &exit) {
		if exit.Err != nil {
			fmt.Fprintln(os.Stderr, "wb:", exit.Err)
		}
		os.Exit(exit.Code)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wb:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	if cli.Handles(args[0]) {
		return cli.Run(ctx, args, cli.Streams{In: os.Stdin, Out: stdout, Err: stderr})
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	case "version":
		fmt.Fprintln(stdout, "wb", version)
		return nil
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "agent":
		return agentCmd(ctx, args[1:], stdout)
	case "node":
		return nodeCmd(ctx, args[1:], stderr)
	case "fleet":
		return fleetCmd(ctx, args[1:], stdout, stderr)
	case "load":
		return loadCmd(ctx, args[1:], stdout, stderr)
	case "envoy-bootstrap":
		return envoyBootstrap(args[1:], stdout, stderr)
	case "fleet-certs":
		return fleetCertsCmd(args[1:], stdout, stderr)
	case "image":
		return imageCmd(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
