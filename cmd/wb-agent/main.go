package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"wb/agent"
	"wb/desktop/guest"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "agent" {
		fmt.Fprintln(os.Stderr, "usage: wb-agent agent [flags] (see wb-agent agent --help)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ok, err := guest.AgentCommand(ctx, os.Args[2:], os.Stdin, os.Stdout) // a desktop guest's helpers
	if !ok {
		stop() // agent.Main handles its own signals
		err = agent.Main(os.Args[2:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wb agent:", err)
		os.Exit(1)
	}
}
