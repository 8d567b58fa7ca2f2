//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentBinary: --agent-bin must name a static binary, and a dynamic or missing one is an
// error that names it and says what to do.
func TestAgentBinary(t *testing.T) {
	static := "/bin/busybox" // busybox-static: what scripts/deps.sh installs
	if got, err := agentBinary(static); err != nil || got != static {
		t.Errorf("agentBinary(%s) = %q, %v; want it accepted", static, got, err)
	}
	dynamic, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agentBinary(dynamic); err == nil || !strings.Contains(err.Error(), "--agent-bin "+dynamic) ||
		!strings.Contains(err.Error(), "dynamically linked") || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("agentBinary(%s): %v, want a refusal naming the flag, the cause and the fix", dynamic, err)
	}
	missing := filepath.Join(t.TempDir(), "nothing")
	if _, err := agentBinary(missing); err == nil || !strings.Contains(err.Error(), "--agent-bin "+missing) {
		t.Errorf("agentBinary(%s): %v, want an error naming the flag", missing, err)
	}
	text := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := agentBinary(text); err == nil || !strings.Contains(err.Error(), "guests cannot run it") {
		t.Errorf("agentBinary(a script): %v, want a refusal", err)
	}
}

// TestDefaultAgent: a node given no --agent-bin runs the wb-agent beside its executable, and
// says when there is none (the whole wb then starts as every guest's agent, at a cost).
func TestDefaultAgent(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "wb")
	if got, _, whole := defaultAgent(self); got != self || !whole {
		t.Errorf("defaultAgent(%s) without a wb-agent beside it = %q, whole %v; want itself, whole", self, got, whole)
	}
	beside := filepath.Join(dir, "wb-agent")
	if err := os.WriteFile(beside, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, _, whole := defaultAgent(self); got != beside || whole {
		t.Errorf("defaultAgent(%s) with a wb-agent beside it = %q, whole %v; want %s, not whole", self, got, whole, beside)
	}
}
