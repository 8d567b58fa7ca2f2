package hypervisor_test

import (
	"strings"
	"testing"

	"wb/hypervisor"
)

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"s_01HZX": true, "a": true, "A.b-c_d": true, strings.Repeat("x", 128): true,
		"": false, ".": false, "..": false, "-x": false, "a/b": false, "a b": false, strings.Repeat("x", 129): false, "a\x00": false,
	} {
		if got := hypervisor.ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	ok := hypervisor.Spec{ID: "g1", RootFS: "/r", Writable: "/w", AgentDir: "/a", Args: []string{"/bin/sh"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*hypervisor.Spec){
		"id":       func(s *hypervisor.Spec) { s.ID = "../x" },
		"rootfs":   func(s *hypervisor.Spec) { s.RootFS = "r" },
		"args":     func(s *hypervisor.Spec) { s.Args = nil },
		"bind":     func(s *hypervisor.Spec) { s.ReadOnlyBinds = []hypervisor.Bind{{Source: "usr", Target: "/usr"}} },
		"memory":   func(s *hypervisor.Spec) { s.MemoryMiB = -1 },
		"agentbin": func(s *hypervisor.Spec) { s.AgentBin = "wb" },
	} {
		s := ok
		mut(&s)
		if err := s.Validate(); err == nil {
			t.Errorf("%s: invalid spec accepted", name)
		}
	}
	if got := hypervisor.WorkspaceDir("/w"); got != "/w/workspace" {
		t.Errorf("WorkspaceDir = %s", got)
	}
}
