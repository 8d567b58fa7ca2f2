package cloudhv_test

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/cloudhv"
	"wb/hypervisor/cloudhv/image"
	"wb/internal/syncbuf"
)

// TestRootImagesKeptWhenListingFails: a listing of the cache dir that fails (here the dir is
// not a dir for a while; an I/O error or a permission does the same) answers the images of the
// last good listing, with one warning for the run of failures, rather than none: the node
// advertises the images on each heartbeat, and none made the gateway refuse every restore of a
// memory snapshot taken on it (and wake desktops from their disks) until a listing succeeded.
// A good listing still answers what the cache holds then, images gone included.
func TestRootImagesKeptWhenListingFails(t *testing.T) {
	e := newEnv(t)
	var logs syncbuf.Buffer
	o := e.opts
	o.StateDir, o.CacheDir = filepath.Join(e.base, "s-images"), filepath.Join(e.base, "cache-images")
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	d, err := cloudhv.New(testCtx(t, time.Minute), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.RemoveCgroupParent() })
	a := ext4Image(t, o.CacheDir, "rootfs-a")
	if got := d.RootImages(); !slices.Equal(got, []string{a}) {
		t.Fatalf("the cache holds %s; RootImages answers %q", a, got)
	}

	// The listing fails: ReadDir of a file that stands where the dir was.
	away := o.CacheDir + ".away"
	if err := os.Rename(o.CacheDir, away); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(o.CacheDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got := d.RootImages(); !slices.Equal(got, []string{a}) {
			t.Fatalf("listing %d of a cache dir that cannot be listed answers %q; want the last good listing's [%s]", i+1, got, a)
		}
	}
	if n := linesWith(logs.String(), "list the root disk images"); n != 1 {
		t.Errorf("three failed listings in a row logged %d warnings, want 1:\n%s", n, logs.String())
	}

	// Listed again: a new image appears, a removed one goes.
	if err := os.Remove(o.CacheDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(away, o.CacheDir); err != nil {
		t.Fatal(err)
	}
	b := ext4Image(t, o.CacheDir, "rootfs-b")
	if err := os.Remove(filepath.Join(o.CacheDir, "rootfs-a")); err != nil {
		t.Fatal(err)
	}
	if got := d.RootImages(); !slices.Equal(got, []string{b}) {
		t.Fatalf("the cache holds %s alone; RootImages answers %q", b, got)
	}
	// A new run of failures warns again, and keeps what the latest good listing found.
	if err := os.Rename(o.CacheDir, away); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(o.CacheDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := d.RootImages(); !slices.Equal(got, []string{b}) {
		t.Fatalf("a failed listing after the cache changed answers %q; want [%s]", got, b)
	}
	if n := linesWith(logs.String(), "list the root disk images"); n != 2 {
		t.Errorf("two runs of failed listings logged %d warnings, want 2:\n%s", n, logs.String())
	}
}

// ext4Image makes an ext4 image named name in dir and answers its id as RootImages names it.
func ext4Image(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", p, "8M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	uuid, err := image.FilesystemUUID(p)
	if err != nil {
		t.Fatal(err)
	}
	return name + "/" + uuid
}

// linesWith answers how many lines of log hold s.
func linesWith(log, s string) int {
	n := 0
	for line := range strings.Lines(log) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}
