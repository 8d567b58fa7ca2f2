package oci_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/proc"
)

// TestEventsWithoutRuntimeCall: Events on a guest the driver created follows the process the
// runtime's create reported (the one its state names too) without running the runtime (on
// runsc a `runsc state` is a process start and a sandbox RPC, on a session's first moments),
// and still reports the guest's exit.
func TestEventsWithoutRuntimeCall(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d, calls := countingDriver(t, rt)
			s := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, s)
			ctx := ctxT(t, time.Minute)
			info, err := d.Info(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(d.BundleDir(s.ID), "init.pid"))
			if err != nil {
				t.Fatal(err)
			}
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err != nil || pid != info.Pid {
				t.Fatalf("create's pid file says %q, the runtime's state pid %d", raw, info.Pid)
			}
			followsWithoutRuntimeCall(ctx, t, d, calls, s.ID)
		})
	}
}

// TestEventsAfterRestoreWithoutRuntimeCall: a guest restored from runsc memory is followed
// from the pid file its restore wrote, as a created one is: a live snapshot restores the
// session's guest and watches it again while the caller waits (a `runsc state` took up to
// two seconds of a snapshot's time on a loaded host).
func TestEventsAfterRestoreWithoutRuntimeCall(t *testing.T) {
	cat := catalog(t)
	d, calls := countingDriver(t, oci.RuntimeRunsc)
	ctx := ctxT(t, 5*time.Minute)
	s := guestSpec(t, cat[templates.Base], jobRunner)
	boot(t, d, s)
	dir := filepath.Join(t.TempDir(), "snap")
	if si, err := d.Snapshot(ctx, s.ID, dir, true); err != nil || !si.Memory {
		t.Fatalf("memory snapshot: %+v, %v", si, err)
	}
	r := guestSpec(t, cat[templates.Base], jobRunner)
	track(t, d, r)
	if err := d.Restore(ctx, r, dir); err != nil {
		t.Fatal(err)
	}
	info, err := d.Info(ctx, r.ID)
	if err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("restored guest: %+v, %v (want running)", info, err)
	}
	raw, err := os.ReadFile(filepath.Join(d.BundleDir(r.ID), "init.pid"))
	if pid, perr := strconv.Atoi(strings.TrimSpace(string(raw))); err != nil || perr != nil || pid != info.Pid {
		t.Fatalf("restore's pid file says %q (%v), the runtime's state pid %d", raw, err, info.Pid)
	}
	followsWithoutRuntimeCall(ctx, t, d, calls, r.ID)
}

// followsWithoutRuntimeCall: Events on guest id runs the runtime (counted in calls) no
// time, and still reports the guest's exit once it is stopped.
func followsWithoutRuntimeCall(ctx context.Context, t *testing.T, d *oci.Driver, calls, id string) {
	t.Helper()
	before := runtimeCalls(t, calls)
	events, err := d.Events(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if after := runtimeCalls(t, calls); after != before {
		t.Fatalf("Events ran the runtime %d times (%s), want none", after-before, lastCall(t, calls))
	}
	if err := d.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case ev, ok := <-events:
		if !ok || ev.Type != hypervisor.EventExit {
			t.Fatalf("event after stop = %+v (open %v), want exit", ev, ok)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit event within 20s of stop")
	}
}

// TestGuestFollowedWithoutState: a live guest is followed (Events, every poll) from its
// init's process alone, without `runc state` or `runsc state`: the runtime's state is that
// process's (runc's init; runsc's sandbox, which ends with its container's process:
// TestRunscSandboxEndsWithItsContainer). Before, every tenth poll (2 s at the default
// interval) of every guest started the runtime, about 9 ms of CPU for runc and 17 for runsc
// (for runsc, 0.85 % of a core for each live session, where an idle sandbox costs 0.06 %).
func TestGuestFollowedWithoutState(t *testing.T) {
	cat := catalog(t)
	for _, rt := range []string{oci.RuntimeRunc, oci.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			d, calls := countingDriver(t, rt, func(o *oci.Options) { o.EventInterval = 5 * time.Millisecond })
			s := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, s)
			ctx := ctxT(t, time.Minute)
			before := runtimeCalls(t, calls)
			events, err := d.Events(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // 60 polls; every tenth asked the runtime
			select {
			case ev, ok := <-events:
				t.Fatalf("event from a live guest: %+v (open %v)", ev, ok)
			default:
			}
			if after := runtimeCalls(t, calls); after != before {
				t.Fatalf("following a live %s guest ran %s %d times (last: %s), want none", rt, rt, after-before, lastCall(t, calls))
			}
			followsWithoutRuntimeCall(ctx, t, d, calls, s.ID)
		})
	}
}

// TestRunscSandboxEndsWithItsContainer: what following a runsc guest by its sandbox's process
// rests on (Events, Stop), for the runsc installed: the sandbox's process (the pid `runsc
// state` gives) ends when its container's process exits (whatever children it left), and
// when a checkpoint saves it, by the time runsc says the container stopped.
func TestRunscSandboxEndsWithItsContainer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs runsc: needs root")
	}
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("runsc is not installed")
	}
	for _, c := range []struct {
		name, script string
		checkpoint   bool
	}{{"exit", "sleep 1; exit 3", false}, {"checkpoint", "sleep 1000", true},
		// The container's process leaves children behind, one in a session of its own (a
		// guest's daemon): they end with it, and the sandbox too.
		{"exit-leaving-children", "sleep 1000 & (setsid sleep 1000 &); sleep 1; exit 3", false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			bundle := filepath.Join(dir, "bundle")
			if err := os.Mkdir(bundle, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
				t.Fatalf("runc spec: %v: %s", err, out)
			}
			var spec map[string]any
			cfg := filepath.Join(bundle, "config.json")
			raw, err := os.ReadFile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &spec); err != nil {
				t.Fatal(err)
			}
			spec["root"] = map[string]any{"path": "/", "readonly": true}
			process := spec["process"].(map[string]any)
			process["terminal"], process["args"] = false, []string{"/bin/sh", "-c", c.script}
			if raw, err = json.Marshal(spec); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cfg, raw, 0o644); err != nil {
				t.Fatal(err)
			}
			root, id := filepath.Join(dir, "state"), fmt.Sprintf("sandboxends%s%d", c.name, rand.IntN(1<<30))
			// The detached sandbox keeps the stdio it is given: a file, not a pipe that
			// CombinedOutput would wait on to its end.
			runsc := func(args ...string) []byte {
				t.Helper()
				out, err := os.CreateTemp(dir, "runsc-out")
				if err != nil {
					t.Fatal(err)
				}
				defer out.Close()
				cmd := exec.Command("runsc", append([]string{"--root", root, "--network", "none"}, args...)...)
				cmd.Stdout, cmd.Stderr = out, out
				err = cmd.Run()
				b, _ := os.ReadFile(out.Name())
				if err != nil {
					t.Fatalf("runsc %v: %v: %s", args, err, b)
				}
				return b
			}
			pidFile := filepath.Join(dir, "sandbox.pid")
			runsc("run", "--detach", "--pid-file", pidFile, "--bundle", bundle, id)
			t.Cleanup(func() { _ = exec.Command("runsc", "--root", root, "delete", "--force", id).Run() })
			b, err := os.ReadFile(pidFile)
			if err != nil {
				t.Fatal(err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 0 {
				t.Fatalf("runsc's pid file: %q", b)
			}
			start, _ := proc.Start(pid) // "" if it has ended already: any process of that pid
			var st struct {
				Status string `json:"status"`
			}
			if c.checkpoint {
				runsc("checkpoint", "--image-path", filepath.Join(dir, "image"), id)
			}
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
				if err := json.Unmarshal(runsc("state", id), &st); err != nil {
					t.Fatal(err)
				}
				if st.Status == "stopped" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the container is %s a minute on, want stopped", st.Status)
				}
			}
			// Its end and its process's may be a moment apart under load.
			for deadline := time.Now().Add(10 * time.Second); proc.Alive(pid, start); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("runsc says the container stopped, but its sandbox's process %d lives on 10 s later", pid)
				}
			}
		})
	}
}

// countingDriver is a driver whose runtime is a wrapper that appends each call's arguments
// to the file it answers.
func countingDriver(t *testing.T, rt string, edit ...func(*oci.Options)) (*oci.Driver, string) {
	t.Helper()
	real, err := exec.LookPath(rt)
	if err != nil {
		t.Fatalf("%s is not installed: %v", rt, err)
	}
	base := t.TempDir()
	calls := filepath.Join(base, "calls")
	wrapper := filepath.Join(base, rt)
	script := "#!/bin/sh\necho \"$*\" >> " + calls + "\nexec " + real + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := newDriver(t, rt, append(edit, func(o *oci.Options) { o.RuntimePath = wrapper })...)
	// What New asked the runtime (runsc --version) is not a guest's call.
	if err := os.WriteFile(calls, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return d, calls
}

func runtimeCalls(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func lastCall(t *testing.T, path string) string {
	t.Helper()
	b, _ := os.ReadFile(path)
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	return l[len(l)-1]
}

// TestSnapshotAsksNoState: a snapshot of a guest this driver started knows the guest's state
// (running, or paused by Pause) without asking the runtime: a `runsc state` is a process
// start, about 0.1 s of a live snapshot here. The runtime runs only for what the snapshot
// does: runsc resumes the paused guest, and its checkpoint is asked of the sandbox directly
// (see Driver.checkpoint: no runsc process); runc freezes it (and the driver thaws it
// through its freezer, see TestResumeStartsNoRunc). A runsc snapshot restores.
func TestSnapshotAsksNoState(t *testing.T) {
	cat := catalog(t)
	for _, c := range []struct {
		rt     string
		paused bool
		want   []string
	}{
		{oci.RuntimeRunsc, false, nil},
		{oci.RuntimeRunsc, true, []string{"resume"}},
		{oci.RuntimeRunc, false, []string{"pause"}},
	} {
		t.Run(fmt.Sprintf("%s/paused=%v", c.rt, c.paused), func(t *testing.T) {
			d, calls := countingDriver(t, c.rt)
			ctx := ctxT(t, 5*time.Minute)
			s := guestSpec(t, cat[templates.Base], jobRunner)
			g, _, _, _ := boot(t, d, s)
			g.mustRun("echo before > /workspace/f")
			if c.paused {
				if err := d.Pause(ctx, s.ID); err != nil {
					t.Fatal(err)
				}
			}
			before := runtimeCalls(t, calls)
			snap := filepath.Join(t.TempDir(), "snap")
			si, err := d.Snapshot(ctx, s.ID, snap, true)
			if err != nil {
				t.Fatal(err)
			}
			if si.Memory != (c.rt == oci.RuntimeRunsc) {
				t.Fatalf("snapshot %+v: memory %v, want %v", si, si.Memory, c.rt == oci.RuntimeRunsc)
			}
			if got := subcommands(t, calls, before); !slices.Equal(got, c.want) {
				t.Fatalf("the snapshot ran the runtime for %v, want %v", got, c.want)
			}
			if c.rt == oci.RuntimeRunc {
				g.mustRun("true") // thawed: it still runs jobs
				return
			}
			// The checkpoint stopped the guest; its image restores it, files and all.
			if err := d.Delete(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			// The checkpoint's image restores (TestSnapshotMemoryRunsc checks what it holds).
			restoreRunning(ctx, t, d, cat, snap)
		})
	}
}

// TestResumeStartsNoRunc: a runc guest's resume thaws its cgroup's freezer, as `runc resume`
// does, without starting runc (20 of a resume's 25 ms here, and most of a second on a loaded
// host: the conformance suite's resume row failed in CI at 1.06 s); runc itself then sees
// the guest running, and the guest runs jobs.
func TestResumeStartsNoRunc(t *testing.T) {
	d, calls := countingDriver(t, oci.RuntimeRunc)
	ctx := ctxT(t, 3*time.Minute)
	s := guestSpec(t, catalog(t)[templates.Base], jobRunner)
	g, _, _, _ := boot(t, d, s)
	g.mustRun("echo before > /workspace/f")
	if err := d.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	before := runtimeCalls(t, calls)
	if err := d.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got := subcommands(t, calls, before); len(got) != 0 {
		t.Fatalf("the resume ran runc for %v, want no runc process", got)
	}
	if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("runc's state after the resume: %+v, %v; want running", info, err)
	}
	if out := g.mustRun("cat /workspace/f"); !strings.Contains(out, "before") {
		t.Fatalf("the guest after the resume answered %q", out)
	}
	// Paused again and resumed: the freezer thaws each time.
	if err := d.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StatePaused {
		t.Fatalf("runc's state after the second pause: %+v, %v; want paused", info, err)
	}
	if err := d.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	g.mustRun("true")
}

// TestStopDeleteAskNoState: ending a guest this driver started (running, or paused) runs the
// runtime only for what it does: thaw a paused runsc guest (which refuses signals while
// paused), kill (a running guest's init, runc's or runsc's sandbox, is killed through a pidfd,
// no runtime), delete (runsc's; runc's of a stopped guest is the driver's own); it knows the guest's state, and that the guest stopped, from the process the
// runtime's create reported. Each `runsc state` is a process start and a sandbox
// RPC, and a session's end took three. The guest still ends stopped, as the runtime says.
func TestStopDeleteAskNoState(t *testing.T) {
	cat := catalog(t)
	for _, c := range []struct {
		rt     string
		paused bool
		want   []string
	}{
		// Its sandbox killed through a pidfd; runsc's delete of it is the driver's own (its
		// gofer gone, its state files and cgroups removed).
		{oci.RuntimeRunsc, false, nil},
		{oci.RuntimeRunsc, true, []string{"resume", "kill"}},
		// Its init killed through a pidfd; runc's delete of a stopped guest is the driver's own
		// (its state dir and cgroups removed).
		{oci.RuntimeRunc, false, nil},
		{oci.RuntimeRunc, true, []string{"kill"}}, // runc thaws it for SIGKILL itself
	} {
		name := c.rt
		if c.paused {
			name += "/paused"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, calls := countingDriver(t, c.rt)
			ctx := ctxT(t, 3*time.Minute)
			s := guestSpec(t, cat[templates.Base], jobRunner)
			g, _, _, _ := boot(t, d, s)
			// A process beside the init: killing the init must take it too.
			var bgPids []int
			if c.rt == oci.RuntimeRunc {
				secs := fmt.Sprint(4000 + rand.IntN(5000))
				g.mustRun("sleep " + secs + " </dev/null >/dev/null 2>&1 &")
				// The shell answers once it has forked; the child may not have become sleep yet
				// (a cold make test looked at once and found none).
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
					if bgPids = hostPids("sleep\x00" + secs + "\x00"); len(bgPids) != 0 || time.Now().After(deadline) {
						break
					}
				}
				if len(bgPids) != 1 {
					t.Fatalf("the guest's background sleep %s is %v on the host, want one process", secs, bgPids)
				}
			}
			if c.paused {
				if err := d.Pause(ctx, s.ID); err != nil {
					t.Fatal(err)
				}
			}
			if c.rt == oci.RuntimeRunsc && len(pidsNaming(s.ID)) == 0 {
				t.Fatalf("no host process names the runsc guest %s: the check after its delete would see none either", s.ID)
			}
			before := runtimeCalls(t, calls)
			t0 := time.Now()
			if err := d.Stop(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			stopTook := time.Since(t0)
			stopped := runtimeCalls(t, calls)
			if len(bgPids) > 0 {
				if err := waitGone(bgPids, 10*time.Second); err != nil {
					t.Errorf("after stop, the guest's background process lives on: %v", err)
				}
			}
			if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateStopped {
				t.Fatalf("info after stop = %+v, %v; want stopped", info, err)
			}
			got := lingerPollsDropped(t, subcommands(t, calls, before)[:stopped-before], stopTook)
			if err := d.Delete(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			got = append(got, subcommands(t, calls, stopped+1)...)
			if !slices.Equal(got, c.want) {
				t.Fatalf("stop and delete ran the runtime for %v, want %v", got, c.want)
			}
			if _, err := d.Info(ctx, s.ID); !errors.Is(err, hypervisor.ErrNotFound) {
				t.Fatalf("info after delete: %v, want ErrNotFound", err)
			}
			// The runtime no longer knows the guest, and its cgroups are gone.
			if ids, err := d.List(ctx); err != nil || slices.Contains(ids, s.ID) {
				t.Fatalf("the runtime lists %v after the delete (%v); want the guest gone", ids, err)
			}
			for _, ctrl := range []string{"", "memory", "pids", "cpu", "freezer"} {
				if dir := filepath.Join("/sys/fs/cgroup", ctrl, d.CgroupPath(s.ID)); exists(dir) {
					t.Errorf("the guest's cgroup %s is left after the delete", dir)
				}
			}
			// No process of the guest's is left: runsc's sandbox (with its ptrace stubs) and
			// gofer name the guest in their command lines.
			if err := waitGone(pidsNaming(s.ID), 10*time.Second); err != nil {
				t.Errorf("after the delete, processes naming the guest live on: %v", err)
			}
		})
	}
}

// pidsNaming answers the host processes whose command line has word as one of its
// arguments, or as a flag's value (--x=word) or a path's last part.
func pidsNaming(word string) []int {
	return hostPidsWhere(func(cmdline string) bool {
		for _, arg := range strings.Split(cmdline, "\x00") {
			if arg == word || strings.HasSuffix(arg, "="+word) || strings.HasSuffix(arg, "/"+word) {
				return true
			}
		}
		return false
	})
}

// subcommands names the runtime calls logged in path after the first skip: each one's first
// word that is an OCI runtime subcommand (the global flags before it are not).
// lingerPollsDropped answers a stop's runtime calls without the `state` calls that Stop makes
// while the killed process lingers, every tenth poll of 10 ms: a loaded host, slow to reap
// it, may cost one per 100 ms of the stop (took), and no more. Calls beyond that are kept
// for the comparison to show.
func lingerPollsDropped(t *testing.T, calls []string, took time.Duration) []string {
	t.Helper()
	n := 0
	for _, c := range calls {
		if c == "state" {
			n++
		}
	}
	if n == 0 || n > int(took/(100*time.Millisecond)) {
		return calls
	}
	t.Logf("the stop took %s, and asked the runtime's state %d times while the process lingered", took, n)
	return slices.DeleteFunc(slices.Clone(calls), func(c string) bool { return c == "state" })
}

func subcommands(t *testing.T, path string, skip int) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	known := []string{"state", "create", "run", "start", "pause", "resume", "checkpoint", "restore", "kill", "delete", "events", "ps", "exec"}
	var out []string
	for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if i < skip {
			continue
		}
		name := "?"
		if j := slices.IndexFunc(strings.Fields(l), func(w string) bool { return slices.Contains(known, w) }); j >= 0 {
			name = strings.Fields(l)[j]
		}
		out = append(out, name)
	}
	return out
}

// TestLaunch: Launch creates and starts a guest with one runtime call (`run --detach`), where
// Create then Boot make two (a runtime's start is most of a warm pool's refill beyond the
// guest's own work); the guest runs as a booted one does, and the driver follows its init
// without asking the runtime. A launch that fails names the runtime's error and leaves nothing.
func TestLaunch(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			d, calls := countingDriver(t, rt)
			ctx := ctxT(t, 3*time.Minute)
			s := guestSpec(t, cat[templates.Base], jobRunner)
			g := track(t, d, s)
			if err := d.Launch(ctx, s); err != nil {
				t.Fatal(err)
			}
			if got := subcommands(t, calls, 0); !slices.Equal(got, []string{"run"}) {
				t.Fatalf("launch ran the runtime for %v, want [run]", got)
			}
			if running, known := d.KnownRunning(s.ID); !running || !known {
				t.Fatalf("after launch the driver knows the guest running=%v known=%v, want both", running, known)
			}
			waitFile(t, filepath.Join(s.AgentDir, "ready"), 2*time.Minute)
			if out := g.mustRun("echo hi"); out != "hi\n" {
				t.Fatalf("job in the launched guest: %q", out)
			}
			if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
				t.Fatalf("info after launch = %+v, %v; want running", info, err)
			}

			bad := guestSpec(t, cat[templates.Base], "")
			bad.Args = []string{"/no/such/program"}
			err := d.Launch(ctx, bad)
			if err == nil {
				track(t, d, bad)
				t.Fatal("a launch of a program the guest lacks succeeded")
			}
			if !strings.Contains(err.Error(), "run "+bad.ID) {
				t.Errorf("launch error %q does not name the runtime's run of the guest", err)
			}
			t.Logf("the failed launch: %v", err)
			if _, err := d.Info(ctx, bad.ID); !errors.Is(err, hypervisor.ErrNotFound) {
				t.Errorf("info after a failed launch: %v, want ErrNotFound", err)
			}
			if _, err := os.Stat(d.BundleDir(bad.ID)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed launch left its bundle: %v", err)
			}
		})
	}
}

// hostPids answers the host's processes whose command line is cmdline (NUL-separated, with
// its trailing NUL), zombies left out.
func hostPids(cmdline string) []int {
	return hostPidsWhere(func(c string) bool { return c == cmdline })
}

// hostPidsWhere answers the host's processes whose command line match takes (a zombie's is
// empty).
func hostPidsWhere(match func(cmdline string) bool) []int {
	dirs, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range dirs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && match(string(b)) {
			out = append(out, pid)
		}
	}
	return out
}

// waitGone waits until none of pids runs (a zombie counts as gone).
func waitGone(pids []int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var alive []int
		for _, pid := range pids {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] != "Z" {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pids %v still run %v later", alive, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestMemoryRestoreKeepsAgentDir: a guest whose process holds a directory and a file of its
// agent dir (its cwd, an open file) at a memory snapshot restores into a guest with a new
// agent dir, which then holds them too: runsc's restore walks to each, and the new, empty
// agent dir failed it ("restoring container …: no such file or directory"), which lost a
// session whose guest process had its cwd under /run/wb at a live snapshot.
func TestMemoryRestoreKeepsAgentDir(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, oci.RuntimeRunsc)
	ctx := ctxT(t, 5*time.Minute)
	s := guestSpec(t, cat[templates.Base], `mkdir -p /run/wb/x && echo kept > /run/wb/x/f && cd /run/wb/x && exec 3< f
echo ready > /run/wb/.ready && mv /run/wb/.ready /run/wb/ready
while :; do sleep 0.1; done`)
	boot(t, d, s)
	dir := filepath.Join(t.TempDir(), "snap")
	if si, err := d.Snapshot(ctx, s.ID, dir, true); err != nil || !si.Memory {
		t.Fatalf("memory snapshot: %+v, %v", si, err)
	}
	r := restoreRunning(ctx, t, d, cat, dir)
	if b, err := os.ReadFile(filepath.Join(r.AgentDir, "x", "f")); err != nil || string(b) != "kept\n" {
		t.Fatalf("the restored guest's agent dir holds x/f %q (%v), want the snapshotted guest's", b, err)
	}
}

// TestDeleteWaitsForLingeringProcesses: a guest's last processes may leave its cgroups a
// second or more after its init died on a loaded host; the delete waits for them (up to a
// few seconds) before it removes the cgroups, rather than leave the directories behind (a
// runc server left 11 after some 250 runs at a load of about 20). Here a host process put
// in the guest's cgroups outlives the stop by a second.
func TestDeleteWaitsForLingeringProcesses(t *testing.T) {
	cat := catalog(t)
	d, _ := countingDriver(t, oci.RuntimeRunc)
	ctx := ctxT(t, 3*time.Minute)
	s := guestSpec(t, cat[templates.Base], jobRunner)
	boot(t, d, s)
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.CgroupPath(s.ID)))
	if len(dirs) == 0 {
		t.Fatalf("no cgroup of the guest under /sys/fs/cgroup/*%s", d.CgroupPath(s.ID))
	}
	late := exec.Command("sleep", "1")
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = late.Wait() }()
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(late.Process.Pid)), 0o644); err != nil {
			t.Fatalf("move the lingering process into %s: %v", dir, err)
		}
	}
	if err := d.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		if exists(dir) {
			t.Errorf("the guest's cgroup %s is left after the delete (a process of it exited a second after the stop)", dir)
		}
	}
}

// TestMemoryRestoreOfSnapshotWithoutAgentDir: a memory snapshot from before agent_dir (a
// snapshot.json without it, no agentdir.tar) restores, into an empty agent dir, as it did.
func TestMemoryRestoreOfSnapshotWithoutAgentDir(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, oci.RuntimeRunsc)
	ctx := ctxT(t, 5*time.Minute)
	s := guestSpec(t, cat[templates.Base], `echo ready > /run/wb/.ready && mv /run/wb/.ready /run/wb/ready
while :; do sleep 0.1; done`)
	boot(t, d, s)
	dir := filepath.Join(t.TempDir(), "snap")
	if si, err := d.Snapshot(ctx, s.ID, dir, true); err != nil || !si.Memory {
		t.Fatalf("memory snapshot: %+v, %v", si, err)
	}
	meta := filepath.Join(dir, "snapshot.json")
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec["agent_dir"] != "agentdir.tar" {
		t.Fatalf("snapshot.json %s: want agent_dir agentdir.tar", b)
	}
	delete(rec, "agent_dir") // as an older node wrote it
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meta, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "agentdir.tar")); err != nil {
		t.Fatal(err)
	}
	r := guestSpec(t, cat[templates.Base], "exit 1")
	track(t, d, r)
	if err := d.Restore(ctx, r, dir); err != nil {
		t.Fatalf("restore of a memory snapshot without agent_dir: %v", err)
	}
	if info, err := d.Info(ctx, r.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("the restored guest: %+v, %v; want running", info, err)
	}
	if ents, _ := os.ReadDir(r.AgentDir); len(ents) > 0 {
		t.Logf("the restored guest's agent dir holds %d entries (its own since the restore)", len(ents))
	}
}

// TestMemorySnapshotRefusesHugeAgentDir: a guest's sparse file in its agent dir, past the
// agent dir's bound at its whole size, refuses the memory snapshot before its checkpoint:
// the guest runs on, and no tar of it was written.
func TestMemorySnapshotRefusesHugeAgentDir(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, oci.RuntimeRunsc)
	ctx := ctxT(t, 5*time.Minute)
	s := guestSpec(t, cat[templates.Base], `dd if=/dev/null of=/run/wb/sparse bs=1 seek=1073741824 2>/dev/null
echo ready > /run/wb/.ready && mv /run/wb/.ready /run/wb/ready
while :; do sleep 0.1; done`)
	boot(t, d, s)
	if fi, err := os.Stat(filepath.Join(s.AgentDir, "sparse")); err != nil || fi.Size() != 1<<30 {
		t.Fatalf("the guest's sparse file on the host: %v, %v; want 1 GiB", fi, err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	_, err := d.Snapshot(ctx, s.ID, dir, true)
	if !errors.Is(err, hypervisor.ErrLayerTooLarge) {
		t.Fatalf("memory snapshot of a guest with a 1 GiB sparse file in its agent dir: %v; want it refused as too large", err)
	}
	if info, ierr := d.Info(ctx, s.ID); ierr != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("after the refusal (%v) the guest is %+v, %v; want it running", err, info, ierr)
	}
	if _, serr := os.Stat(filepath.Join(dir, "agentdir.tar")); serr == nil {
		t.Fatal("the refused snapshot wrote the agent dir's tar")
	}
}

// restoreRunning restores the memory snapshot in dir as a new guest of d and answers its spec,
// once the guest runs.
func restoreRunning(ctx context.Context, t *testing.T, d *oci.Driver, cat templates.Catalog, dir string) hypervisor.Spec {
	t.Helper()
	r := guestSpec(t, cat[templates.Base], "exit 1") // a memory restore runs no args
	track(t, d, r)
	if err := d.Restore(ctx, r, dir); err != nil {
		t.Fatal(err)
	}
	if info, err := d.Info(ctx, r.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("the restored guest: %+v, %v; want running", info, err)
	}
	return r
}

// TestLaunchDirect: on runsc, LaunchDirect starts a guest whose init has the caller's
// standard streams and no agent (one runtime call, as Launch); the driver lists its processes
// by name (GuestProcesses) without one. A direct launch that fails leaves nothing; runc
// refuses direct guests (its agent dir is sealed from the guest once its agent listens).
func TestLaunchDirect(t *testing.T) {
	cat := catalog(t)
	t.Run("runsc", func(t *testing.T) {
		t.Parallel()
		d, calls := countingDriver(t, oci.RuntimeRunsc)
		ctx := ctxT(t, 3*time.Minute)
		s := guestSpec(t, cat[templates.Base], "")
		s.Args = []string{"/bin/sh", "-c", "read x; echo got $x; echo oops >&2; sleep 3333"}
		track(t, d, s)
		inR, inW, _ := os.Pipe()
		outR, outW, _ := os.Pipe()
		errR, errW, _ := os.Pipe()
		defer func() { _, _, _, _ = inW.Close(), outR.Close(), errR.Close(), inR.Close() }()
		err := d.LaunchDirect(ctx, s, [3]*os.File{inR, outW, errW})
		_, _ = outW.Close(), errW.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := subcommands(t, calls, 0); !slices.Equal(got, []string{"run"}) {
			t.Fatalf("a direct launch ran the runtime for %v, want [run]", got)
		}
		if _, err := inW.Write([]byte("hello\n")); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(outR).ReadString('\n')
		if err != nil || line != "got hello\n" {
			t.Fatalf("the guest's stdout: %q, %v; want \"got hello\\n\"", line, err)
		}
		eline, err := bufio.NewReader(errR).ReadString('\n')
		if err != nil || eline != "oops\n" {
			t.Fatalf("the guest's stderr: %q, %v; want \"oops\\n\"", eline, err)
		}
		var names []string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			ps, err := d.GuestProcesses(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			names = names[:0]
			for _, p := range ps {
				names = append(names, p.Name)
			}
			if slices.Contains(names, "sleep") || time.Now().After(deadline) {
				break
			}
		}
		if !slices.Contains(names, "sleep") {
			t.Errorf("the guest's processes: %v; want its sleep", names)
		}

		bad := guestSpec(t, cat[templates.Base], "")
		bad.Args = []string{"/no/such/program"}
		if err := d.LaunchDirect(ctx, bad, [3]*os.File{nil, nil, nil}); err == nil {
			track(t, d, bad)
			t.Fatal("a direct launch of a program the guest lacks succeeded")
		}
		if _, err := os.Stat(d.BundleDir(bad.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a failed direct launch left its bundle: %v", err)
		}
	})
	t.Run("runc", func(t *testing.T) {
		t.Parallel()
		d := newDriver(t, oci.RuntimeRunc)
		s := guestSpec(t, cat[templates.Base], "")
		if d.CanLaunchDirect() {
			t.Error("runc says it can launch direct guests")
		}
		if err := d.LaunchDirect(ctxT(t, time.Minute), s, [3]*os.File{}); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("a direct launch on runc: %v; want ErrUnsupported", err)
		}
	})
}
