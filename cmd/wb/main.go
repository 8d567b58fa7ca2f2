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

	"wb/agent"
	"wb/desktop/guest"
)

const usage = `wb — control plane and edge gateway for agent sandboxes.

Usage:
  wb <command> [flags]

Commands:
  serve     run the whole platform on this machine (gateway, placer, webhooks, a node)
  node      run guests for a control plane that shares its Redis
  plugins   test a Wasm plugin locally, or push it to a project
  envoy-bootstrap  print the bootstrap YAML of one Envoy of the fleet
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
		if ok, err := guest.AgentCommand(ctx, args[1:], os.Stdin, stdout); ok { // hidden: a desktop guest's helpers
			return err
		}
		return agent.Main(args[1:])
	case "node":
		return nodeCmd(ctx, args[1:], stderr)
	case "plugins":
		return pluginsCmd(ctx, args[1:], stdout, stderr)
	case "envoy-bootstrap":
		return envoyBootstrap(args[1:], stdout, stderr)
	case "image":
		return imageCmd(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
