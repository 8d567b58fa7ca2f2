package wbbin

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallCopiesTheSharedBinary: with WB_TEST_BIN set, Install copies that file into the
// caller's directory, executable by everyone (a guest's unprivileged user runs it), and
// builds nothing.
func TestInstallCopiesTheSharedBinary(t *testing.T) {
	src := filepath.Join(t.TempDir(), "wb-test")
	want := []byte("#!/bin/sh\necho shared\n")
	if err := os.WriteFile(src, want, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar, src)
	t.Setenv(AgentEnvVar, src)
	dir := t.TempDir()
	got, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(dir, "wb") {
		t.Fatalf("path %s, want %s", got, filepath.Join(dir, "wb"))
	}
	b, err := os.ReadFile(got)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("contents %q, %v; want %q", b, err, want)
	}
	fi, err := os.Stat(got)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v, %v; want 0755", fi.Mode(), err)
	}
}

// TestInstallNamesTheVariable: a WB_TEST_BIN that names nothing fails with a message naming
// the variable, rather than silently building another binary.
func TestInstallNamesTheVariable(t *testing.T) {
	t.Setenv(EnvVar, filepath.Join(t.TempDir(), "missing"))
	agent := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(agent, nil, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv(AgentEnvVar, agent)
	_, err := Install(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), EnvVar) {
		t.Fatalf("err %v, want one naming %s", err, EnvVar)
	}
}

// TestAgentCopiesTheSharedAgent: Agent takes WB_TEST_AGENT_BIN, not WB_TEST_BIN; Install
// puts the agent beside wb, where wb looks for it.
func TestAgentCopiesTheSharedAgent(t *testing.T) {
	dir := t.TempDir()
	server, agent := filepath.Join(dir, "server"), filepath.Join(dir, "agent")
	if err := os.WriteFile(server, []byte("server"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agent, []byte("agent"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar, server)
	t.Setenv(AgentEnvVar, agent)
	out := t.TempDir()
	got, err := Agent(out)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(got); got != filepath.Join(out, "wb-agent") || string(b) != "agent" {
		t.Fatalf("Agent put %q at %s, want the agent at %s", b, got, filepath.Join(out, "wb-agent"))
	}
	// Install puts both, each where wb looks.
	out = t.TempDir()
	if got, err = Install(out); err != nil || got != filepath.Join(out, "wb") {
		t.Fatalf("Install: %s, %v", got, err)
	}
	for name, want := range map[string]string{"wb": "server", "wb-agent": "agent"} {
		if b, _ := os.ReadFile(filepath.Join(out, name)); string(b) != want {
			t.Errorf("Install put %q at %s, want the %s", b, name, want)
		}
	}
	t.Setenv(AgentEnvVar, filepath.Join(dir, "missing"))
	if _, err := Agent(t.TempDir()); err == nil || !strings.Contains(err.Error(), AgentEnvVar) {
		t.Fatalf("err %v, want one naming %s", err, AgentEnvVar)
	}
}

// TestAgentBuildsAStaticAgent: with no prebuilt agent, Agent builds cmd/wb-agent, a static
// binary that answers `agent --help`.
func TestAgentBuildsAStaticAgent(t *testing.T) {
	t.Setenv(AgentEnvVar, "")
	got, err := Agent(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(got)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked; guests need a static agent", got)
		}
	}
	out, err := exec.Command(got, "agent", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Usage: wb agent") {
		t.Fatalf("agent --help: %v\n%s", err, out)
	}
	out, err = exec.Command(got, "serve").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "usage: wb-agent agent") {
		t.Fatalf("wb-agent serve: %v %q, want a refusal with its usage", err, out)
	}
}
