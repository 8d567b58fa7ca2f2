//go:build linux

package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackendFlags: --backend cloudhv with a missing binary or kernel is a start-up error
// naming the flag and the path; an unknown back end or cloudhv's flags without it are refused.
func TestBackendFlags(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "cloud-hypervisor")
	kernel := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kernel, []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		f    nodeFlags
		want []string
	}{
		{"missing binary", nodeFlags{backend: "cloudhv", chBinary: filepath.Join(dir, "nope"), kernel: kernel}, []string{"--ch-binary", filepath.Join(dir, "nope")}},
		{"no binary", nodeFlags{backend: "cloudhv", kernel: kernel}, []string{"--ch-binary"}},
		{"missing kernel", nodeFlags{backend: "cloudhv", chBinary: bin, kernel: filepath.Join(dir, "nokernel")}, []string{"--kernel", filepath.Join(dir, "nokernel")}},
		{"no kernel", nodeFlags{backend: "cloudhv", chBinary: bin}, []string{"--kernel"}},
		{"unknown backend", nodeFlags{backend: "qemu"}, []string{"--backend", "qemu"}},
		{"cloudhv flags without it", nodeFlags{backend: "oci", kernel: kernel}, []string{"--backend cloudhv"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.f.dataDir, tc.f.id = filepath.Join(dir, "data"), "n1"
			_, err := newDriver(tc.f, log)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	drv, err := newDriver(nodeFlags{backend: "cloudhv", chBinary: bin, kernel: kernel, dataDir: filepath.Join(dir, "data"), id: "n1"}, log)
	if err != nil || drv.Name() != "cloudhv" {
		t.Fatalf("a good cloudhv setup: %v, %v", drv, err)
	}
}
