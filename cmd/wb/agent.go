//go:build linux

package main

import (
	"context"
	"io"
	"os"

	"wb/agent"
	"wb/desktop/guest"
)

// agentCmd is `wb agent`, the process inside each guest.
func agentCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if ok, err := guest.AgentCommand(ctx, args, os.Stdin, stdout); ok { // hidden: a desktop guest's helpers
		return err
	}
	return agent.Main(args)
}
