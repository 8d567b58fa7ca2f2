package oci_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
)

// TestStoppedGuestsDeleteLeaveNothing: guests stopped in each way a run's guest stops (killed
// running, killed paused, and on runsc checkpointed by a memory snapshot, whose delete comes
// while the sandbox may still be exiting), stopped and deleted concurrently, leave no
// process, runtime state, mount, bundle or cgroup (newDriver's cleanup). The driver deletes
// such guests itself, without the runtime's delete.
func TestStoppedGuestsDeleteLeaveNothing(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			d := newDriver(t, rt, func(o *oci.Options) { o.StateRoot = state })
			ctx := ctxT(t, 5*time.Minute)
			ways := []string{"running", "running", "paused", "paused"}
			if rt == oci.RuntimeRunsc {
				ways = append(ways, "checkpointed", "checkpointed")
			}
			specs := make([]hypervisor.Spec, len(ways))
			for i, way := range ways {
				specs[i] = guestSpec(t, cat[templates.Base], jobRunner)
				boot(t, d, specs[i])
				switch way {
				case "paused":
					if err := d.Pause(ctx, specs[i].ID); err != nil {
						t.Fatal(err)
					}
				case "checkpointed":
					if _, err := d.Snapshot(ctx, specs[i].ID, filepath.Join(t.TempDir(), "snap"), true); err != nil {
						t.Fatal(err)
					}
				}
			}
			mi, _ := os.ReadFile("/proc/self/mountinfo")
			for _, s := range specs {
				if !strings.Contains(string(mi), " "+s.Writable+" ") {
					t.Fatalf("guest %s has no disk mounted at %s: the test would not see its disk left", s.ID, s.Writable)
				}
			}
			var wg sync.WaitGroup
			for _, s := range specs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := d.Stop(ctx, s.ID); err != nil {
						t.Errorf("stop %s: %v", s.ID, err)
					}
					if err := d.Delete(ctx, s.ID); err != nil {
						t.Errorf("delete %s: %v", s.ID, err)
					}
				}()
			}
			wg.Wait()
			for i, s := range specs {
				if l := guestLeftovers(state, d.BundleDir(s.ID), s); len(l) > 0 {
					t.Errorf("a %s guest's delete left: %q", ways[i], l)
				}
			}
		})
	}
}

// guestLeftovers answers what of guest s is left on the host: processes naming it, entries
// of the runtime's state root naming it, mounts of its dirs, its bundle.
func guestLeftovers(stateRoot, bundle string, s hypervisor.Spec) []string {
	var out []string
	for _, p := range processesNaming(s.ID) {
		out = append(out, "process: "+p)
	}
	ents, _ := os.ReadDir(stateRoot)
	for _, e := range ents {
		if strings.Contains(e.Name(), s.ID) {
			out = append(out, "state: "+e.Name())
		}
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		for _, p := range []string{s.ID, s.Writable, s.AgentDir, bundle} {
			if strings.Contains(l, p) {
				out = append(out, "mount: "+l)
				break
			}
		}
	}
	// Its disk's loop device: attached while any mount namespace (a killed gofer's, until it
	// has exited) still holds the file system.
	img := filepath.Clean(s.Writable) + ".img"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		var held []string
		for _, f := range loops {
			if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), img) {
				held = append(held, f)
			}
		}
		if len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			out = append(out, fmt.Sprintf("loop devices 10 s after: %q", held))
			break
		}
	}
	if _, err := os.Lstat(bundle); err == nil {
		out = append(out, fmt.Sprintf("bundle: %s", bundle))
	}
	return out
}

// TestFailedMemoryRestoreLeavesNoDisk: a memory restore that fails after the new guest's disk
// was attached (or the old guest's adopted) but before its record was written (here its agent
// dir is a file) lets the disk go: no record names it, so the guest's Delete could not, and
// the node's removal of the guest's dir then emptied the mounted disk, removed its image and
// left the mount.
func TestFailedMemoryRestoreLeavesNoDisk(t *testing.T) {
	cat := catalog(t)
	for _, adopt := range []bool{false, true} {
		t.Run(fmt.Sprintf("adopt=%v", adopt), func(t *testing.T) {
			d := newDriver(t, oci.RuntimeRunsc)
			ctx := ctxT(t, 5*time.Minute)
			s := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, s)
			dir := filepath.Join(t.TempDir(), "snap")
			if _, err := d.Snapshot(ctx, s.ID, dir, true); err != nil {
				t.Fatal(err)
			}
			r := guestSpec(t, cat[templates.Base], "exit 1")
			track(t, d, r)
			if err := os.WriteFile(r.AgentDir, nil, 0o644); err != nil { // not a directory
				t.Fatal(err)
			}
			var err error
			if adopt {
				err = d.RestoreAdopting(ctx, r, dir, s.ID)
			} else {
				err = d.Restore(ctx, r, dir)
			}
			if err == nil {
				t.Fatal("a restore whose agent dir is a file succeeded")
			}
			if derr := d.Delete(ctx, r.ID); derr != nil { // as the node does after a failed restore
				t.Logf("delete after the failed restore: %v", derr)
			}
			mi, _ := os.ReadFile("/proc/self/mountinfo")
			if strings.Contains(string(mi), " "+r.Writable+" ") {
				_ = syscall.Unmount(r.Writable, syscall.MNT_DETACH)
				t.Fatalf("after the failed restore (%v) and the guest's delete, its disk is still mounted at %s", err, r.Writable)
			}
			if _, serr := os.Stat(filepath.Clean(r.Writable) + ".img"); serr == nil {
				t.Fatalf("after the failed restore (%v) and the guest's delete, its disk image is left", err)
			}
		})
	}
}

// TestAdoptedGuestAskedOfTheRuntime: a guest that an earlier driver on the same roots made
// (a node restarted) is not known by its init's process: its stop and delete are asked of
// the runtime (runc's state and delete; runsc's), and its exit is seen, leaving nothing.
func TestAdoptedGuestAskedOfTheRuntime(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			base := t.TempDir()
			roots := func(o *oci.Options) {
				o.StateRoot, o.BundleRoot = filepath.Join(base, "state"), filepath.Join(base, "bundles")
				o.CgroupParent = "/wbtest-adopt-" + filepath.Base(base)
			}
			old := newDriver(t, rt, roots)
			s := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, old, s)
			d, calls := countingDriver(t, rt, roots, func(o *oci.Options) { o.EventInterval = 5 * time.Millisecond })
			ctx := ctxT(t, 3*time.Minute)
			if _, known := d.KnownRunning(s.ID); known {
				t.Fatal("a guest an earlier driver made is known to the new one")
			}
			events, err := d.Events(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(calls)
			if err := d.Stop(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			// The stop asks the runtime the guest's state once, and then follows the process
			// it named, as Events does: not a `runsc state` (a process start, 17 ms of CPU)
			// every 10 ms until the kill took.
			after, _ := os.ReadFile(calls)
			if n := strings.Count(string(after[len(before):]), " state "+s.ID); n != 1 {
				t.Errorf("the adopted guest's stop asked its state %d times, want once:\n%s", n, after[len(before):])
			}
			select {
			case ev := <-events:
				if ev.Type != hypervisor.EventExit {
					t.Fatalf("event %+v, want exit", ev)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no exit event 30 s after the adopted guest's stop")
			}
			if err := d.Delete(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(calls)
			for _, want := range []string{" state " + s.ID, " delete "} {
				if !strings.Contains(string(b), want) {
					t.Errorf("the adopted guest's stop and delete did not run %q of the runtime:\n%s", want, b)
				}
			}
			if l := guestLeftovers(filepath.Join(base, "state"), d.BundleDir(s.ID), s); len(l) > 0 {
				t.Errorf("the adopted guest's delete left: %q", l)
			}
		})
	}
}

// TestConsoleFailureLeavesNothing: a guest's start (create, launch) or memory restore that
// fails after prepare, here at the open of its console log (made to fail), says what failed
// and leaves nothing prepare made: no mount (its disk, agent dir, console), loop device,
// disk image or bundle. Before, it returned at once, and all of them stayed, with a bundle
// that made the id's next start fail as "already exists".
func TestConsoleFailureLeavesNothing(t *testing.T) {
	cat := catalog(t)
	fault := errors.New("injected console fault")
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			d := newDriver(t, rt, func(o *oci.Options) { o.StateRoot = state })
			ctx := ctxT(t, 5*time.Minute)
			type start struct {
				what string
				do   func(hypervisor.Spec) error
			}
			starts := []start{
				{"create", func(s hypervisor.Spec) error { return d.Create(ctx, s) }},
				{"launch", func(s hypervisor.Spec) error { return d.Launch(ctx, s) }},
			}
			if d.MemorySnapshots() {
				src := guestSpec(t, cat[templates.Base], jobRunner)
				boot(t, d, src)
				snap := filepath.Join(t.TempDir(), "snap")
				if _, err := d.Snapshot(ctx, src.ID, snap, true); err != nil {
					t.Fatal(err)
				}
				starts = append(starts, start{"memory restore", func(s hypervisor.Spec) error { return d.Restore(ctx, s, snap) }})
			}
			d.FailConsole(fault)
			for _, st := range starts {
				s := guestSpec(t, cat[templates.Base], jobRunner)
				track(t, d, s)
				err := st.do(s)
				if !errors.Is(err, fault) || !strings.Contains(err.Error(), "console log") || !strings.Contains(err.Error(), s.ID) {
					t.Errorf("a %s whose console log cannot be opened: %v; want an error that names the guest and its console log", st.what, err)
				}
				left := guestLeftovers(state, d.BundleDir(s.ID), s)
				if _, err := os.Stat(filepath.Clean(s.Writable) + ".img"); err == nil {
					left = append(left, "disk image")
				}
				if len(left) > 0 {
					t.Errorf("a %s whose console log could not be opened left %q", st.what, left)
				}
			}
		})
	}
}

// TestCreateOfAGuestThatExistsLeavesIt: a start (create, launch) of a guest id that exists
// already fails saying so, and leaves the guest that has it as it was: its disk mounted, its
// files there, its jobs answered. Before, the start attached "its" disk (the existing guest's,
// mounted already), met the guest's record in prepare, and then let go of that disk:
// unmounted, its image removed, under the running guest.
func TestCreateOfAGuestThatExistsLeavesIt(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			g, _, _, _ := boot(t, d, guestSpec(t, cat[templates.Base], jobRunner))
			ctx := ctxT(t, 2*time.Minute)
			if out := g.mustRun("echo kept > /workspace/f && echo ok"); out != "ok\n" {
				t.Fatalf("a job wrote %q", out)
			}
			for _, start := range []func() error{func() error { return d.Create(ctx, g.spec) }, func() error { return d.Launch(ctx, g.spec) }} {
				if err := start(); err == nil || !strings.Contains(err.Error(), "already exists") {
					t.Errorf("a start of guest %s, which exists: %v; want an error that says it exists", g.spec.ID, err)
				}
			}
			mi, _ := os.ReadFile("/proc/self/mountinfo")
			if !strings.Contains(string(mi), " "+g.spec.Writable+" ") {
				t.Errorf("after a second start of its id the guest's disk is no longer mounted at %s", g.spec.Writable)
			}
			if _, err := os.Stat(filepath.Clean(g.spec.Writable) + ".img"); err != nil {
				t.Errorf("after a second start of its id the guest's disk image: %v", err)
			}
			if out := g.mustRun("cat /workspace/f"); out != "kept\n" {
				t.Errorf("after a second start of its id the guest's file holds %q", out)
			}
		})
	}
}
