package cloudhv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
)

// TestSnapshotRestore: a disk-only snapshot leaves the guest running and a memory snapshot
// stops it; either restores into a new guest (a new VMM) that has the file written in
// /workspace before the snapshot.
func TestSnapshotRestore(t *testing.T) {
	for _, memory := range []bool{false, true} {
		name := "disk"
		if memory {
			name = "memory"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t, 5*time.Minute)
			s := e.spec(newID())
			c := e.boot(t, ctx, s)
			sh(t, ctx, c, "echo kept > /workspace/f")
			dir := filepath.Join(e.base, "snap")
			info, err := e.d.Snapshot(ctx, s.ID, dir, memory)
			if err != nil {
				t.Fatal(err)
			}
			if info.Memory != memory || info.SizeBytes <= 0 {
				t.Errorf("SnapshotInfo = %+v; want memory %v and a size", info, memory)
			}
			st, err := e.d.Info(ctx, s.ID)
			switch {
			case err != nil:
				t.Fatal(err)
			case memory && st.State != hypervisor.StateStopped:
				t.Errorf("after a memory snapshot the guest is %s; want stopped (the caller restores)", st.State)
			case !memory && st.State != hypervisor.StateRunning:
				t.Errorf("after a disk snapshot the guest is %s; want running", st.State)
			case !memory:
				sh(t, ctx, c, "echo after > /workspace/g")
			}
			r := e.spec(newID())
			if err := e.d.Restore(ctx, r, dir); err != nil {
				t.Fatal(err)
			}
			rc := e.agentOf(r.ID)
			defer rc.Close()
			waitHealthy(t, ctx, rc, 2*time.Minute)
			if got := sh(t, ctx, rc, "cat /workspace/f; ls /workspace"); got != "kept\nf\n" {
				t.Errorf("restored guest's /workspace: %q; want f alone, holding kept", got)
			}
			if st, err := e.d.Info(ctx, r.ID); err != nil || st.State != hypervisor.StateRunning {
				t.Errorf("restored guest: %+v, %v", st, err)
			}
			if !cloudhv.ConsoleRelayed(e.d, r.ID) {
				t.Error("the restored guest's console is not copied")
			}
		})
	}
}

// TestFailedMemorySnapshotResumesGuest: a memory snapshot that fails after the driver paused
// the VM (here its dir's "vm" already exists, or its disk copy's file does) answers the error
// with the guest running on, its agent answering, and dir holding none of the snapshot's files.
func TestFailedMemorySnapshotResumesGuest(t *testing.T) {
	for _, tc := range []struct {
		name, there string // there: what dir already holds, which makes the snapshot fail
	}{
		{name: "mkdir", there: "vm"},
		{name: "disk copy", there: "writable.img"}, // after CH wrote dir/vm
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := testCtx(t, 5*time.Minute)
			s := e.spec(newID())
			c := e.boot(t, ctx, s)
			dir := filepath.Join(e.base, "snap")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			there := filepath.Join(dir, tc.there)
			if tc.there == "vm" {
				if err := os.Mkdir(there, 0o700); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(there, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := e.d.Snapshot(ctx, s.ID, dir, true); err == nil {
				t.Fatal("the snapshot succeeded; want it to fail on what dir already holds")
			}
			st, err := e.d.Info(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != hypervisor.StateRunning {
				t.Errorf("after a failed memory snapshot the guest is %q; want running", st.State)
			}
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := c.Health(hctx); err != nil {
				t.Errorf("after a failed memory snapshot the agent does not answer: %v", err)
			}
			// The egress relay, stopped for the snapshot, serves the guest again.
			if res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "nc -w 5 10.0.0.1 3128 </dev/null"}}, nil); err != nil || res.ExitCode != 0 {
				t.Errorf("after a failed memory snapshot the guest cannot connect to its egress relay: %+v, %v", res, err)
			}
			if _, err := os.Stat(there); err != nil {
				t.Errorf("what dir held before the snapshot: %v", err)
			}
			for _, f := range []string{"snapshot.json", "vm/config.json"} {
				if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the failed snapshot left %s (%v)", f, err)
				}
			}
		})
	}
}

// TestMemoryRestoreOnAnotherNode: a memory snapshot is restored by a driver with a cache dir
// and a kernel of its own (another node, which got the snapshot from the object store) when
// that cache holds the very image the guest ran on (a copy: the same filesystem), with its
// config naming this node's files; the first node's cache and kernel are gone by then.
// Another build of the image (the same template and wb, another mkfs), or none (another
// wb's, after an upgrade), is refused with ErrSnapshotImage before any VMM starts: the
// guest's memory belongs to its image. (The node then starts the session from the disk.)
func TestMemoryRestoreOnAnotherNode(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 5*time.Minute)
	kernel1 := filepath.Join(e.base, "vmlinuz-1")
	if err := os.WriteFile(kernel1, []byte("node 1's kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	o1 := e.opts
	o1.StateDir, o1.CacheDir, o1.Kernel = filepath.Join(e.base, "s1"), filepath.Join(e.base, "cache1"), kernel1
	o1.CgroupParent += "-1"
	d1, err := cloudhv.New(ctx, o1)
	if err != nil {
		t.Fatal(err)
	}
	s := e.spec(newID())
	t.Cleanup(func() {
		_ = d1.Delete(context.Background(), s.ID)
		_ = d1.RemoveCgroupParent()
	})
	if err := d1.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := d1.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	c := e.agentOfDriver(d1, s.ID)
	defer c.Close()
	waitHealthy(t, ctx, c, 2*time.Minute)
	sh(t, ctx, c, "echo kept > /workspace/f")
	img1, err := cloudhv.RootFSImage(d1, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.base, "snap")
	info, err := d1.Snapshot(ctx, s.ID, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	// The image the snapshot names is one node 1 advertises (for the placement of restores).
	if info.RootImage == "" || !slices.Contains(d1.RootImages(), info.RootImage) {
		t.Fatalf("the memory snapshot names root image %q; node 1 advertises %q", info.RootImage, d1.RootImages())
	}
	imgCopy := filepath.Join(e.base, "image-copy")
	if out, err := exec.Command("cp", "--sparse=always", img1, imgCopy).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	// Node 1's cache and kernel are not on node 2's host.
	if err := os.RemoveAll(o1.CacheDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(kernel1); err != nil {
		t.Fatal(err)
	}

	for i, tc := range []struct {
		name string
		// cache fills node 2's cache dir, where the image of guest spec r is path.
		cache func(t *testing.T, d *cloudhv.Driver, r hypervisor.Spec, path string)
		ok    bool
		// has: node 2 advertises the image the snapshot names (RootImages).
		has bool
	}{
		// An earlier driver's record names no image: its config.json's path, the same here,
		// holds a file that cannot be told from another build of the image.
		// (Node 2 has the image; only the record lacks its names.)
		{name: "an earlier driver's record", has: true, cache: func(t *testing.T, _ *cloudhv.Driver, _ hypervisor.Spec, path string) {
			// The path its config.json names holds the image too (on node 2's host: the
			// same --data-dir), so that only the record's missing names refuse it.
			if err := os.MkdirAll(filepath.Dir(img1), 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(img1)) })
			for _, to := range []string{path, img1} {
				if out, err := exec.Command("cp", "--sparse=always", imgCopy, to).CombinedOutput(); err != nil {
					t.Fatalf("cp: %v: %s", err, out)
				}
			}
			recFile := filepath.Join(dir, "snapshot.json")
			b, err := os.ReadFile(recFile)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.WriteFile(recFile, b, 0o600) })
			var rec map[string]any
			if err := json.Unmarshal(b, &rec); err != nil {
				t.Fatal(err)
			}
			delete(rec, "rootfs_image")
			delete(rec, "rootfs_uuid")
			old, _ := json.Marshal(rec)
			if err := os.WriteFile(recFile, old, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "its image", ok: true, has: true, cache: func(t *testing.T, _ *cloudhv.Driver, _ hypervisor.Spec, path string) {
			if err := os.Rename(imgCopy, path); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "another build of its image", cache: func(t *testing.T, d *cloudhv.Driver, r hypervisor.Spec, path string) {
			r.ID = newID()
			if err := d.Create(ctx, r); err != nil { // builds node 2's own image
				t.Fatal(err)
			}
			if err := d.Delete(ctx, r.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("node 2's own build of the image: %v", err)
			}
		}},
		{name: "none of its name", cache: func(*testing.T, *cloudhv.Driver, hypervisor.Spec, string) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := e.opts
			o.StateDir, o.CacheDir = filepath.Join(e.base, fmt.Sprintf("s2-%d", i)), filepath.Join(e.base, fmt.Sprintf("cache2-%d", i))
			o.CgroupParent += fmt.Sprintf("-2-%d", i)
			d2, err := cloudhv.New(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			r := e.spec(newID())
			t.Cleanup(func() {
				_ = d2.Delete(context.Background(), r.ID)
				_ = d2.RemoveCgroupParent()
			})
			img2 := filepath.Join(o.CacheDir, filepath.Base(img1))
			tc.cache(t, d2, r, img2)
			if got := slices.Contains(d2.RootImages(), info.RootImage); got != tc.has {
				t.Errorf("node 2 advertises %q: has the snapshot's %s %v, want %v", d2.RootImages(), info.RootImage, got, tc.has)
			}
			err = d2.Restore(ctx, r, dir)
			if !tc.ok {
				if !errors.Is(err, cloudhv.ErrSnapshotImage) {
					t.Fatalf("Restore: %v; want ErrSnapshotImage", err)
				}
				t.Logf("Restore refused (as it should): %v", err)
				if ids, _ := d2.List(ctx); len(ids) > 0 {
					t.Errorf("a refused restore left guests %v", ids)
				}
				return
			}
			if err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if got, err := cloudhv.RootFSImage(d2, r.ID); err != nil || got != img2 {
				t.Errorf("the restored guest runs on %q (%v); want this node's %s", got, err, img2)
			}
			rc := e.agentOfDriver(d2, r.ID)
			defer rc.Close()
			waitHealthy(t, ctx, rc, 2*time.Minute)
			if got := sh(t, ctx, rc, "cat /workspace/f"); got != "kept\n" {
				t.Errorf("restored guest's /workspace/f: %q", got)
			}
			if ents, _ := os.ReadDir(d2.GuestDir(r.ID)); slices.ContainsFunc(ents, func(e os.DirEntry) bool { return e.Name() == "restore" }) {
				t.Error("the restore's staged snapshot is left in the guest's dir")
			}
		})
	}
}
