package oci_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
