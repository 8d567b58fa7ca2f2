package wbbin

import (
	"bytes"
	"os"
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
	_, err := Install(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), EnvVar) {
		t.Fatalf("err %v, want one naming %s", err, EnvVar)
	}
}
