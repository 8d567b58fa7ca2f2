package oci

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"wb/internal/syncbuf"
)

// TestGuestsPidsMax: the guests' total is the host's task limit (the smaller of pid_max and
// threads-max) less max(4096, an eighth), and at least half of it.
func TestGuestsPidsMax(t *testing.T) {
	for _, c := range []struct {
		pidMax, threadsMax string
		tasks, total       int64
	}{
		{"32768\n", "192735\n", 32768, 32768 - 4096},          // this build host
		{"4194304\n", "192735\n", 192735, 192735 - 24091},     // systemd's pid_max, 24 GiB: threads-max is the smaller
		{"4194304\n", "8000000\n", 4194304, 4194304 - 524288}, // an eighth
		{"32768\n", "max\n", 0, 0},
		{"12000", "12000", 12000, 12000 - 4096},
		{"8192", "1000000", 8192, 4096},
		{"400", "1000000", 400, 200}, // a host too small for the reserve keeps half
	} {
		dir := t.TempDir()
		pm, tm := filepath.Join(dir, "pid_max"), filepath.Join(dir, "threads-max")
		if err := os.WriteFile(pm, []byte(c.pidMax), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(tm, []byte(c.threadsMax), 0o644); err != nil {
			t.Fatal(err)
		}
		tasks, err := hostTasks(pm, tm)
		if c.tasks == 0 {
			if err == nil {
				t.Errorf("pid_max %q, threads-max %q: %d tasks, want an error", c.pidMax, c.threadsMax, tasks)
			}
			continue
		}
		if err != nil || tasks != c.tasks {
			t.Errorf("pid_max %q, threads-max %q: %d tasks, %v; want %d", c.pidMax, c.threadsMax, tasks, err, c.tasks)
			continue
		}
		if got := guestsPidsMax(tasks); got != c.total {
			t.Errorf("guestsPidsMax(%d) = %d, want %d", tasks, got, c.total)
		}
	}
	if _, err := hostTasks(filepath.Join(t.TempDir(), "absent"), "/proc/sys/kernel/threads-max"); err == nil {
		t.Error("an absent pid_max gave a task limit")
	}
}

// TestCapPids: the guests' cgroup gets the total unless it holds a lower value (an
// operator's), a higher one is lowered, and a second node (or a restart) changes nothing.
// On v2 the pids controller is enabled in the ancestors first.
func TestCapPids(t *testing.T) {
	for _, c := range []struct {
		was      string
		limit    int64
		got      int64
		kept     bool
		wantFile string
	}{
		{"max\n", 28672, 28672, false, "28672"},
		{"1000\n", 28672, 1000, true, "1000\n"},
		{"28672\n", 28672, 28672, true, "28672\n"},
		{"30000\n", 28672, 28672, false, "28672"},
	} {
		root := t.TempDir()
		h := cgroupHost{v1: map[string]string{"pids": filepath.Join(root, "pids")}}
		file := filepath.Join(root, "pids", "wb", "pids.max")
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(c.was), 0o644); err != nil {
			t.Fatal(err)
		}
		got, kept, err := h.capPids("/wb", c.limit)
		if b, _ := os.ReadFile(file); err != nil || got != c.got || kept != c.kept || string(b) != c.wantFile {
			t.Errorf("pids.max %q, cap %d: got %d, kept %v, %v, file %q; want %d, %v, %q", c.was, c.limit, got, kept, err, b, c.got, c.kept, c.wantFile)
		}
		if got, kept, err := h.capPids("/wb", c.limit); err != nil || got != c.got || !kept {
			t.Errorf("pids.max %q, cap %d again: got %d, kept %v, %v; want %d kept", c.was, c.limit, got, kept, err, c.got)
		}
	}

	if _, _, err := (cgroupHost{v1: map[string]string{}}).capPids("/wb", 100); err == nil || !strings.Contains(err.Error(), "no v1 pids hierarchy") {
		t.Errorf("no pids hierarchy: %v", err)
	}

	// v2: /sys/fs/cgroup/a/b, the pids controller enabled in the root and in a, not in b.
	root := t.TempDir()
	h := cgroupHost{v2: true, v2Root: root}
	for dir, ctl := range map[string]string{root: "cpu memory\n", filepath.Join(root, "a"): "cpu pids\n", filepath.Join(root, "a", "b"): ""} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(ctl), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "a", "b", "pids.max"), []byte("max\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, kept, err := h.capPids("/a/b", 500); err != nil || got != 500 || kept {
		t.Errorf("v2 /a/b: got %d, kept %v, %v; want 500 set", got, kept, err)
	}
	for dir, want := range map[string]string{root: "+pids", filepath.Join(root, "a"): "cpu pids\n", filepath.Join(root, "a", "b"): ""} {
		if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); string(b) != want {
			t.Errorf("v2 %s: cgroup.subtree_control %q, want %q", dir, b, want)
		}
	}
}

// TestCheckGuestsCgroup: the guests' common cgroup holds the driver's parent, and is not the
// root.
func TestCheckGuestsCgroup(t *testing.T) {
	for _, c := range []struct {
		guests, parent string
		ok             bool
	}{
		{"/wb", "/wb/n1", true}, {"/wb", "/wb", true}, {"/wb/", "/wb/n1/", true},
		{"/wb", "/wbx/n1", false}, {"/", "/wb", false}, {"/wb/n1", "/wb", false}, {"wb", "/wb/n1", false},
	} {
		if err := checkGuestsCgroup(c.guests, c.parent); (err == nil) != c.ok {
			t.Errorf("checkGuestsCgroup(%q, %q) = %v, want ok %v", c.guests, c.parent, err, c.ok)
		}
	}
}

// TestGuestsTotalNote: a guest's failed start or exit names the guests' total when they hold
// 90% of it or more (then other guests' processes may be what failed it), and nothing else
// otherwise or when the total cannot be read.
func TestGuestsTotalNote(t *testing.T) {
	for _, c := range []struct {
		current, max string
		note         bool
	}{
		{"200\n", "200\n", true}, {"180\n", "200\n", true}, {"179\n", "200\n", false},
		{"5000\n", "max\n", false}, {"", "200\n", false},
	} {
		root := t.TempDir()
		d := &Driver{cg: cgroupHost{v1: map[string]string{"pids": root}}, guestsCgroup: "/wb"}
		dir := filepath.Join(root, "wb")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, v := range map[string]string{"pids.current": c.current, "pids.max": c.max} {
			if v != "" {
				if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		note := d.guestsTotalNote()
		if c.note != (note != "") || c.note && !strings.Contains(note, strings.TrimSpace(c.current)+" processes of their total of 200 (/wb pids.max)") {
			t.Errorf("pids.current %q, pids.max %q: note %q, want one: %v", c.current, c.max, note, c.note)
		}
		err := d.atGuestsTotal(errors.New("runc create failed"))
		if !strings.Contains(err.Error(), "runc create failed") || c.note != strings.Contains(err.Error(), "the host's guests hold") {
			t.Errorf("pids.current %q, pids.max %q: a failed start says %q", c.current, c.max, err)
		}
	}
}

// TestCapGuestsPidsWarnsOfALowerTotal: a total lower than the node's own (left by a test, an
// older release, or a pid_max raised since) is kept, as an operator's would be, and the node
// warns of it at each start, saying what it holds the guests to and how to lift it: at Info
// among the start's lines, a host's guests held to 200 processes went unseen for good. The
// node's own value, or one a node of this release wrote, is no warning.
func TestCapGuestsPidsWarnsOfALowerTotal(t *testing.T) {
	for _, c := range []struct {
		was  string
		warn bool
	}{{"200\n", true}, {"28672\n", false}, {"max\n", false}} {
		root := t.TempDir()
		pm, tm := filepath.Join(root, "pid_max"), filepath.Join(root, "threads-max")
		for f, v := range map[string]string{pm: "32768\n", tm: "192735\n"} {
			if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		file := filepath.Join(root, "pids", "wb", "pids.max")
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(c.was), 0o644); err != nil {
			t.Fatal(err)
		}
		var logs syncbuf.Buffer
		d := &Driver{cg: cgroupHost{v1: map[string]string{"pids": filepath.Join(root, "pids")}}, guestsCgroup: "/wb",
			log: slog.New(slog.NewTextHandler(&logs, nil))}
		d.capGuestsPids(pm, tm)
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "pids_max="+strings.TrimSpace(c.was))
		if warned != c.warn {
			t.Errorf("pids.max %q, the node's own total 28672: warned %v, want %v; the log:\n%s", c.was, warned, c.warn, logs.String())
		}
	}
}
