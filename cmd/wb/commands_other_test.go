//go:build !linux

package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestLinuxOnly: off Linux, each command that needs it says so, and the callers' commands
// are there.
func TestLinuxOnly(t *testing.T) {
	for _, args := range [][]string{{"serve"}, {"node", "--help"}, {"fleet"}, {"image", "build"}, {"agent"}, {"load", "--fleet"}} {
		err := run(context.Background(), args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "wb "+args[0]) || !strings.Contains(err.Error(), "runs only on Linux: ") {
			t.Errorf("wb %s: %v; want wb %s runs only on Linux: …", strings.Join(args, " "), err, args[0])
		}
	}
	for _, args := range [][]string{{"version"}, {"sessions", "--help"}} {
		if err := run(context.Background(), args, io.Discard, io.Discard); err != nil {
			t.Errorf("wb %s: %v", strings.Join(args, " "), err)
		}
	}
}
