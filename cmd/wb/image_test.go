//go:build linux

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestImageHelp(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"image"}},
		{[]string{"image", "--help"}, []string{"wb image build"}},
		{[]string{"image", "build", "--help"}, []string{"-out", "-wb", "-kernel-deb", "-kernel", "-size", "-cache-dir", "linux-image-cloud-amd64", "manifest.json", "mkfs.ext4"}},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), c.args, &out, &errb)
		if err != nil && !strings.Contains(err.Error(), "help") {
			t.Errorf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(out.String()+errb.String(), w) {
				t.Errorf("%v: help lacks %q:\n%s%s", c.args, w, out.String(), errb.String())
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"image"}, "build"},
		{[]string{"image", "frob"}, "frob"},
		{[]string{"image", "build"}, "--out"},
		{[]string{"image", "build", "--out", t.TempDir(), "--size", "lots"}, "--size"},
	} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), c.args, &out, &errb); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v does not name %q", c.args, err, c.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"": 0, "4096": 4096, "64K": 64 << 10, "512M": 512 << 20, "2g": 2 << 30} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"M", "-1", "0", "1.5G", "12X"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

// TestImageBuild: `wb image build` with a given kernel writes the image and says where.
func TestImageBuild(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"mkfs.ext4", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	dir := t.TempDir()
	kernel, wb := filepath.Join(dir, "bzImage"), filepath.Join(dir, "wb")
	for _, p := range []string{kernel, wb} {
		if err := os.WriteFile(p, []byte(p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "img")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"image", "build", "--out", out, "--wb", wb, "--kernel", kernel, "--size", "48M"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), filepath.Join(out, "manifest.json")) {
		t.Errorf("stdout does not name the manifest:\n%s", stdout.String())
	}
	for _, f := range []string{"manifest.json", "vmlinuz", "rootfs.ext4"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(out, "rootfs.ext4")); err != nil || fi.Size() != 48<<20 {
		t.Errorf("--size 48M: %v %v", fi, err)
	}
}
