package oci_test

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/fleet"
	"wb/internal/proc"
)

// openDataDir is oci.OpenDataDir on dataDir for a test: the driver's cgroups, and the run
// dir's mount, are removed when the test ends (after its guests, which track deletes).
func openDataDir(t testing.TB, rt, dataDir string, runBytes int64) (*oci.Driver, oci.Layout) {
	t.Helper()
	d, l, err := oci.OpenDataDir(ctxT(t, 2*time.Minute), oci.Options{Runtime: rt, CgroupParent: "/wbtest-rd-" + filepath.Base(dataDir),
		Logger: slog.New(slog.NewTextHandler(testLogWriter{t}, nil))}, dataDir, runBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.RemoveCgroupParent() })
	return d, l
}

// unmountRunDirAtEnd detaches dataDir's run dir when the test ends, whatever it left: tests
// leave no mount behind. Called first, so that it runs after the guests' deletes.
func unmountRunDirAtEnd(t testing.TB, dataDir string) {
	t.Cleanup(func() {
		for mounts(t, oci.RunLayout(dataDir).RunDir) > 0 {
			if err := syscall.Unmount(oci.RunLayout(dataDir).RunDir, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount the run dir: %v", err)
				return
			}
		}
	})
}

// bootOnDisk boots a guest on template tpl as an older node did: its state and bundle in
// dataDir's on-disk layout.
func bootOnDisk(t testing.TB, rt, dataDir string, tpl templates.Template) *guest {
	t.Helper()
	disk := oci.DiskLayout(dataDir)
	old := newDriver(t, rt, func(o *oci.Options) {
		o.StateRoot, o.BundleRoot = disk.StateRoot, disk.BundleRoot
		o.CgroupParent = "/wbtest-rd-" + filepath.Base(dataDir)
	})
	g, _, _, _ := boot(t, old, guestSpec(t, tpl, jobRunner))
	return g
}

// openOnDisk opens dataDir, which holds an older node's guest on its disk layout, and checks
// that the driver keeps that layout.
func openOnDisk(t testing.TB, rt, dataDir string) *oci.Driver {
	t.Helper()
	d, l := openDataDir(t, rt, dataDir, oci.RunDirBytes)
	if disk := oci.DiskLayout(dataDir); l != disk {
		t.Fatalf("with an older node's guest in the on-disk state: layout %+v, want the on-disk one %+v", l, disk)
	}
	return d
}

// answersThenEnds checks that g, driven now by d (a node started again), answers a job, then
// stops and deletes it and ends d's node (ReleaseRunDir).
func answersThenEnds(t testing.TB, g *guest, d *oci.Driver, who string) {
	t.Helper()
	g.d = d
	if out := g.mustRun("echo alive"); out != "alive\n" {
		t.Errorf("%s's job said %q", who, out)
	}
	ctx := ctxT(t, 2*time.Minute)
	if err := d.Stop(ctx, g.spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, g.spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.ReleaseRunDir(ctx); err != nil {
		t.Fatal(err)
	}
}

// mounts counts the mounts on dir.
func mounts(t testing.TB, dir string) int {
	t.Helper()
	n, err := fleet.MountsOn(dir)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func listed(t testing.TB, d *oci.Driver) []string {
	t.Helper()
	ids, err := d.List(ctxT(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestRunDirAdoptedByARestartedNode: a driver on a data dir keeps the runtime's state and
// bundles on a tmpfs of its own (the disk templates stay on disk); a node that ends with
// guests leaves it mounted, and the next start reuses that mount (not a second over it),
// adopting the guests; ended with none, the node unmounts it.
func TestRunDirAdoptedByARestartedNode(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			dataDir := reachableTempDir(t)
			unmountRunDirAtEnd(t, dataDir)
			d, l := openDataDir(t, rt, dataDir, oci.RunDirBytes)
			if l.RunDir == "" || mounts(t, l.RunDir) != 1 {
				t.Fatalf("a fresh data dir's layout %+v: %d mounts on its run dir, want a tmpfs there", l, mounts(t, l.RunDir))
			}
			var st unix.Statfs_t
			if err := unix.Statfs(l.StateRoot, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
				t.Fatalf("state root %s: not on a tmpfs (%v, type %#x)", l.StateRoot, err, st.Type)
			}
			s := guestSpec(t, cat[templates.Base], jobRunner)
			g, _, _, _ := boot(t, d, s)
			if tpls, _ := filepath.Glob(filepath.Join(l.DiskTemplates, "*.img")); len(tpls) == 0 || strings.HasPrefix(l.DiskTemplates, l.RunDir+"/") {
				t.Errorf("disk templates in %s (%v): want them on the data dir's disk, beside the images copied from them", l.DiskTemplates, tpls)
			}
			// The node ends with its guest running: the tmpfs stays.
			if err := d.ReleaseRunDir(ctxT(t, time.Minute)); err != nil {
				t.Fatal(err)
			}
			if n := mounts(t, l.RunDir); n != 1 {
				t.Fatalf("after a node's end with a guest running: %d mounts on the run dir, want it kept", n)
			}
			d2, l2 := openDataDir(t, rt, dataDir, oci.RunDirBytes)
			if l2 != l {
				t.Errorf("the restarted node's layout %+v, want the first's %+v", l2, l)
			}
			if n := mounts(t, l.RunDir); n != 1 {
				t.Fatalf("after the node's restart: %d mounts on the run dir, want the first reused", n)
			}
			if ids := listed(t, d2); !slices.Contains(ids, s.ID) {
				t.Fatalf("the restarted node lists %v, want its guest %s", ids, s.ID)
			}
			answersThenEnds(t, g, d2, "the adopted guest")
			if n := mounts(t, l.RunDir); n != 0 {
				t.Errorf("after a node's end with no guest: %d mounts on the run dir, want none", n)
			}
		})
	}
}

// TestRunDirWaitsForTheDiskLayoutsGuests: a rolling deploy, a node started on the data dir of
// an older node whose guest still runs in the on-disk state: it drives that guest there (and
// mounts nothing), and moves to the run dir at a start that finds none left.
func TestRunDirWaitsForTheDiskLayoutsGuests(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			dataDir := reachableTempDir(t)
			unmountRunDirAtEnd(t, dataDir)
			g := bootOnDisk(t, rt, dataDir, cat[templates.Base])
			s := g.spec
			d := openOnDisk(t, rt, dataDir)
			if n := mounts(t, oci.RunLayout(dataDir).RunDir); n != 0 {
				t.Errorf("with an older node's guest in the on-disk state: %d mounts on the run dir, want none", n)
			}
			if ids := listed(t, d); !slices.Contains(ids, s.ID) {
				t.Fatalf("the new node lists %v, want the older node's guest %s", ids, s.ID)
			}
			answersThenEnds(t, g, d, "the older node's guest")

			d3, l3 := openDataDir(t, rt, dataDir, oci.RunDirBytes)
			if l3 != oci.RunLayout(dataDir) || mounts(t, l3.RunDir) != 1 {
				t.Fatalf("a start with no guest left on disk: layout %+v, %d mounts on its run dir; want the run dir's", l3, mounts(t, l3.RunDir))
			}
			s3 := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d3, s3)
			if ids := listed(t, d3); !slices.Contains(ids, s3.ID) {
				t.Fatalf("on the run dir: lists %v, want %s", ids, s3.ID)
			}
		})
	}
}

// TestRunDirFull: a run dir with no room left fails a guest's start with an error that says
// so, and the guests already there are unaffected; room made, starts work again.
func TestRunDirFull(t *testing.T) {
	cat := catalog(t)
	dataDir := reachableTempDir(t)
	unmountRunDirAtEnd(t, dataDir)
	d, l := openDataDir(t, oci.RuntimeRunc, dataDir, oci.RunDirBytes)
	g, _, _, _ := boot(t, d, guestSpec(t, cat[templates.Base], jobRunner))

	filler := filepath.Join(l.RunDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the run dir: %v, want ENOSPC", err)
	}
	s := guestSpec(t, cat[templates.Base], jobRunner)
	track(t, d, s)
	ctx := ctxT(t, 2*time.Minute)
	err = d.Create(ctx, s)
	if err == nil || !strings.Contains(err.Error(), "no room left for its runtime state and bundle in "+l.RunDir) {
		t.Fatalf("a start on a full run dir: %v; want an error that says the run dir is full", err)
	}
	if out := g.mustRun("echo alive"); out != "alive\n" {
		t.Errorf("the guest already there, its job said %q", out)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := d.Create(ctx, s); err != nil {
		t.Fatalf("a start once room is made: %v", err)
	}
	if err := d.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestRunDirFullLeavesNothing: on a run dir with little room left (none, then a few pages
// more each time, so that the start fails at each of its writes in turn: the bundle's, then
// the runtime's own state), a guest's start fails saying so and leaves nothing of itself (no
// process, state, bundle or mount); the guest already there runs on.
func TestRunDirFullLeavesNothing(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			dataDir := reachableTempDir(t)
			unmountRunDirAtEnd(t, dataDir)
			d, l := openDataDir(t, rt, dataDir, oci.RunDirBytes)
			g, _, _, _ := boot(t, d, guestSpec(t, cat[templates.Base], jobRunner))
			f, full := fillRunDir(t, l)
			ctx := ctxT(t, 5*time.Minute)
			failed := 0
			for free := int64(0); free <= 256<<10; free += 8 << 10 {
				if err := f.Truncate(full - free); err != nil {
					t.Fatal(err)
				}
				s := guestSpec(t, cat[templates.Base], jobRunner)
				track(t, d, s)
				err := d.Launch(ctx, s)
				if err == nil {
					t.Logf("a start with %d KiB free in the run dir: started", free>>10)
					if err := d.Stop(ctx, s.ID); err != nil {
						t.Fatal(err)
					}
					if err := d.Delete(ctx, s.ID); err != nil {
						t.Fatal(err)
					}
					break
				}
				failed++
				fullRunDirFailed(t, "start", free, err, d, l, s, guestLeftovers(l.StateRoot, d.BundleDir(s.ID), s))
			}
			if failed == 0 {
				t.Errorf("no start failed on a full run dir")
			}
			if out := g.mustRun("echo alive"); out != "alive\n" {
				t.Errorf("the guest already there, its job said %q", out)
			}
		})
	}
}

// fullRunDirFailed checks an op (start, restore) of guest s that failed with err on a run
// dir with free bytes left: the error says the run dir is full, and the op left nothing
// (left: what the caller found) the runtime lists.
func fullRunDirFailed(t *testing.T, op string, free int64, err error, d *oci.Driver, l oci.Layout, s hypervisor.Spec, left []string) {
	t.Helper()
	if !strings.Contains(err.Error(), "no room left for its runtime state and bundle in "+l.RunDir) {
		t.Errorf("a %s with %d KiB free in the run dir: %v; want an error that says the run dir is full", op, free>>10, err)
	}
	if len(left) > 0 {
		t.Errorf("a %s with %d KiB free in the run dir failed (%v) and left %q", op, free>>10, err, left)
	}
	if ids := listed(t, d); slices.Contains(ids, s.ID) {
		t.Errorf("a %s with %d KiB free in the run dir failed, and the runtime still lists it: %v", op, free>>10, ids)
	}
}

// fillRunDir fills l's run dir with a file, which it answers open, and that file's size.
func fillRunDir(t testing.TB, l oci.Layout) (*os.File, int64) {
	t.Helper()
	f, err := os.Create(filepath.Join(l.RunDir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	buf := make([]byte, 1<<20)
	for err == nil {
		_, err = f.Write(buf)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the run dir: %v, want ENOSPC", err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return f, fi.Size()
}

// TestRunDirFullRestoreLeavesNothing: a restore from a snapshot (runsc: of memory, runc: of
// the disk, which boots a new guest) on a run dir with little room left fails as a start
// does (TestRunDirFullLeavesNothing), at each of its writes in turn: saying the run dir is
// full, and leaving nothing of itself (no process, state, bundle, mount or disk image).
func TestRunDirFullRestoreLeavesNothing(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			dataDir := reachableTempDir(t)
			unmountRunDirAtEnd(t, dataDir)
			d, l := openDataDir(t, rt, dataDir, oci.RunDirBytes)
			ctx := ctxT(t, 5*time.Minute)
			g, _, _, _ := boot(t, d, guestSpec(t, cat[templates.Base], jobRunner))
			src := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, src)
			snap := filepath.Join(t.TempDir(), "snap")
			if _, err := d.Snapshot(ctx, src.ID, snap, true); err != nil {
				t.Fatal(err)
			}
			f, full := fillRunDir(t, l)
			failed := 0
			for free := int64(0); free <= 256<<10; free += 16 << 10 {
				if err := f.Truncate(full - free); err != nil {
					t.Fatal(err)
				}
				s := guestSpec(t, cat[templates.Base], jobRunner)
				track(t, d, s)
				err := d.Restore(ctx, s, snap)
				if err == nil {
					t.Logf("a restore with %d KiB free in the run dir: restored", free>>10)
					break
				}
				failed++
				left := guestLeftovers(l.StateRoot, d.BundleDir(s.ID), s)
				if _, err := os.Stat(filepath.Clean(s.Writable) + ".img"); err == nil {
					left = append(left, "disk image")
				}
				fullRunDirFailed(t, "restore", free, err, d, l, s, left)
			}
			if failed == 0 {
				t.Errorf("no restore failed on a full run dir")
			}
			if out := g.mustRun("echo alive"); out != "alive\n" {
				t.Errorf("the guest already there, its job said %q", out)
			}
		})
	}
}

// TestRunDirBothLayouts: a node that starts with guests in both layouts (a new node's in the
// run dir, then, rolled back, an older node's on disk, then rolled forward) drives the disk
// layout's, and reaps the run dir's, which no node can drive any more (the older node found
// them gone and failed their sessions): they are not left running for good, and the run dir
// goes with them.
func TestRunDirBothLayouts(t *testing.T) {
	cat := catalog(t)
	rt := oci.RuntimeRunc
	dataDir := reachableTempDir(t)
	unmountRunDirAtEnd(t, dataDir)
	d1, l1 := openDataDir(t, rt, dataDir, oci.RunDirBytes)
	if l1.RunDir == "" {
		t.Fatalf("a fresh data dir's layout %+v, want the run dir's", l1)
	}
	a := guestSpec(t, cat[templates.Base], jobRunner)
	boot(t, d1, a)
	ia, err := d1.Info(ctxT(t, time.Minute), a.ID)
	if err != nil || ia.Pid <= 0 {
		t.Fatalf("the run dir's guest: %+v, %v", ia, err)
	}
	aStart, ok := proc.Start(ia.Pid)
	if !ok {
		t.Fatalf("the run dir's guest's process %d is gone", ia.Pid)
	}

	gb := bootOnDisk(t, rt, dataDir, cat[templates.Base])
	b := gb.spec
	d := openOnDisk(t, rt, dataDir)
	gb.d = d
	if out := gb.mustRun("echo alive"); out != "alive\n" {
		t.Errorf("the older node's guest's job said %q", out)
	}
	if ids := listed(t, d); !slices.Contains(ids, b.ID) {
		t.Errorf("the node lists %v, want the older node's guest %s", ids, b.ID)
	}
	if proc.Alive(ia.Pid, aStart) {
		t.Errorf("the run dir's guest %s, which the node does not drive, still runs (pid %d)", a.ID, ia.Pid)
	}
	if n := mounts(t, l1.RunDir); n != 0 {
		t.Errorf("a node on the disk layout: %d mounts left on the run dir, want none", n)
	}
}

// corruptState puts into l's state root the entry of a guest that runtime rt cannot read: a
// state that is JSON of no container (another version's, or one half written), on which
// runsc's list fails (it panics); runc's list skips it, saying so.
func corruptState(t testing.TB, rt string, l oci.Layout) {
	t.Helper()
	p := filepath.Join(l.StateRoot, "tbroken_sandbox:tbroken.state")
	if rt == oci.RuntimeRunc {
		p = filepath.Join(l.StateRoot, "tbroken", "state.json")
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRunDirCorruptDiskState: a node whose on-disk state holds an entry the runtime cannot
// read (runsc's list of it fails) starts, and drives the guests wherever they are, destroying
// none: an older node's guest on disk (the node keeps the disk layout), or its own in the run
// dir (it adopts them there). With neither, it starts too (on disk: the state may hold
// guests), and guests start on it. Before, the failed list stopped the node's start. Only a
// node that can list neither state does not start: it cannot tell where its guests are.
func TestRunDirCorruptDiskState(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			t.Run("older node's guest on disk", func(t *testing.T) {
				dataDir := reachableTempDir(t)
				unmountRunDirAtEnd(t, dataDir)
				g := bootOnDisk(t, rt, dataDir, cat[templates.Base])
				corruptState(t, rt, oci.DiskLayout(dataDir))
				answersThenEnds(t, g, openOnDisk(t, rt, dataDir), "the older node's guest")
			})
			t.Run("own guest in the run dir", func(t *testing.T) {
				dataDir := reachableTempDir(t)
				unmountRunDirAtEnd(t, dataDir)
				d, l := openDataDir(t, rt, dataDir, oci.RunDirBytes)
				if l.RunDir == "" {
					t.Fatalf("a fresh data dir's layout %+v, want the run dir's", l)
				}
				g, _, _, _ := boot(t, d, guestSpec(t, cat[templates.Base], jobRunner))
				corruptState(t, rt, oci.DiskLayout(dataDir))
				d2, l2 := openDataDir(t, rt, dataDir, oci.RunDirBytes)
				if l2 != l {
					t.Fatalf("the restarted node's layout %+v, want the run dir's %+v, where its guest runs", l2, l)
				}
				answersThenEnds(t, g, d2, "the run dir's guest")
			})
			t.Run("no guest", func(t *testing.T) {
				dataDir := reachableTempDir(t)
				unmountRunDirAtEnd(t, dataDir)
				corruptState(t, rt, oci.DiskLayout(dataDir))
				d, l := openDataDir(t, rt, dataDir, oci.RunDirBytes)
				t.Logf("layout %+v", l)
				boot(t, d, guestSpec(t, cat[templates.Base], jobRunner))
			})
			if rt != oci.RuntimeRunsc {
				return // runc lists past the entry
			}
			t.Run("neither state listed", func(t *testing.T) {
				dataDir := reachableTempDir(t)
				unmountRunDirAtEnd(t, dataDir)
				openDataDir(t, rt, dataDir, oci.RunDirBytes) // mounts the run dir
				corruptState(t, rt, oci.RunLayout(dataDir))
				corruptState(t, rt, oci.DiskLayout(dataDir))
				_, _, err := oci.OpenDataDir(ctxT(t, time.Minute), oci.Options{Runtime: rt, CgroupParent: "/wbtest-rd-" + filepath.Base(dataDir)}, dataDir, oci.RunDirBytes)
				if err == nil || !strings.Contains(err.Error(), "cannot tell which holds its guests") {
					t.Fatalf("a start where neither the on-disk state nor the run dir's can be listed: %v; want an error that says so", err)
				}
			})
		})
	}
}

// TestRunDirBothLayoutsCorruptDisk: guests in both layouts (a new node's in the run dir,
// then, rolled back, an older node's on disk, then rolled forward), and an on-disk state the
// runtime cannot list: the node drives the disk layout's guests, found one by one through
// their bundles, as it does when that state lists (TestRunDirBothLayouts): the older node ran
// last, failed the run dir's guests' sessions and runs its own there. Taking the run dir's
// for its own, the node failed the sessions that ran and drove those that had ended.
func TestRunDirBothLayoutsCorruptDisk(t *testing.T) {
	cat := catalog(t)
	rt := oci.RuntimeRunsc // runc lists past the entry
	dataDir := reachableTempDir(t)
	unmountRunDirAtEnd(t, dataDir)
	d1, l1 := openDataDir(t, rt, dataDir, oci.RunDirBytes)
	if l1.RunDir == "" {
		t.Fatalf("a fresh data dir's layout %+v, want the run dir's", l1)
	}
	boot(t, d1, guestSpec(t, cat[templates.Base], jobRunner))
	gb := bootOnDisk(t, rt, dataDir, cat[templates.Base])
	corruptState(t, rt, oci.DiskLayout(dataDir))
	answersThenEnds(t, gb, openOnDisk(t, rt, dataDir), "the older node's guest")
}
