package node_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/templates"
	"wb/node"
	"wb/session"
	"wb/store"
)

// attack is one way a guest exhausts what it has. Each runs bounded in time: by the exec's
// own timeout (the agent kills the exec's process group) and by timeout(1) inside the guest.
type attack struct {
	name     string
	cmd      string
	timeoutS int
	// oomOK: the attack may end the session with oom (a memory hog under runsc, where the
	// kernel's OOM killer takes the whole sandbox); then the session must be failed (oom).
	oomOK bool
	// check looks at the attack's own result (its clear error, or its normal output).
	check func(t *testing.T, res session.ExecResult, err error)
}

func attacks() []attack {
	return []attack{
		{name: "fork bomb", timeoutS: 6, cmd: `timeout 5 sh -c 'f(){ f|f& }; f; sleep 30'; sleep 30`,
			check: func(t *testing.T, res session.ExecResult, err error) {
				if err != nil {
					t.Fatalf("the exec that ran the fork bomb got no answer: %v", err)
				}
				// Its timeout (124), or 137 when the agent's guard ended a bomb that stayed at
				// the process limit (a loaded host lets the bomb hold the limit longer).
				if res.ExitCode != 124 && res.ExitCode != 137 {
					t.Errorf("fork bomb: exit %d, want its timeout (124) or the guard's kill (137)", res.ExitCode)
				}
				if !strings.Contains(res.Stderr, "fork") && !strings.Contains(res.Stderr, "Resource temporarily unavailable") {
					t.Errorf("fork bomb: stderr %q says nothing of the process limit", tail(res.Stderr))
				}
			}},
		// 4 children, each to the guest's fd limit (65536, or the host's hard limit: 20000
		// here), a third of its fds files through runsc's gofer. 8 children took 52 s under
		// runsc in make test's attack step, for no more proof: each child stops at its own limit.
		{name: "fd bomb", timeoutS: 110, cmd: `cd /workspace && timeout 100 python3 -c '
import os, sys
for i in range(4):
    if os.fork() == 0:
        fds = []
        try:
            while True:
                r, w = os.pipe(); fds += [r, w]
                fds.append(os.open("/workspace/fd%d" % (len(fds) % 64), os.O_RDONLY | os.O_CREAT))
        except OSError as e:
            print("child %d stopped at %d fds: %s" % (i, len(fds), e), flush=True)
        os._exit(0)
for i in range(4):
    os.wait()
print("fd bomb done")
'; rm -f /workspace/fd*`,
			check: func(t *testing.T, res session.ExecResult, err error) {
				if err != nil || !strings.Contains(res.Stdout, "fd bomb done") || !strings.Contains(res.Stdout, "Too many open files") {
					t.Errorf("fd bomb: exit %d, stdout %q, stderr %q, err %v; want every child stopped at its fd limit", res.ExitCode, tail(res.Stdout), tail(res.Stderr), err)
				}
			}},
		{name: "disk fill", timeoutS: 120, cmd: `timeout 110 dd if=/dev/zero of=/workspace/fill bs=1M count=1300 2>&1; echo "exit $?"; ls -l /workspace/fill; if echo x > /tmp/more; then echo TMP-WRITABLE; fi; rm -f /workspace/fill /tmp/more; echo removed`,
			check: func(t *testing.T, res session.ExecResult, err error) {
				// 1.3 GB on a 1 GiB disk: the write stops with ENOSPC.
				if err != nil || !strings.Contains(res.Stdout, "No space left on device") || !strings.Contains(res.Stdout, "exit 1") || !strings.Contains(res.Stdout, "removed") {
					t.Errorf("disk fill: exit %d, stdout %q, stderr %q, err %v; want the write to stop at the disk's size", res.ExitCode, tail(res.Stdout), tail(res.Stderr), err)
				}
			}},
		{name: "cpu spin", timeoutS: 10, cmd: `for i in 1 2 3 4 5 6 7 8; do timeout 6 sh -c 'while :; do :; done' & done; wait; echo spun`,
			check: func(t *testing.T, res session.ExecResult, err error) {
				if err != nil || !strings.Contains(res.Stdout, "spun") {
					t.Errorf("cpu spin: exit %d, stdout %q, err %v", res.ExitCode, tail(res.Stdout), err)
				}
			}},
		// 600 MB written at once, past the 256 MiB limit. (A shell's $(head | tr) filled it
		// through millions of small reads: 28 s under runsc's ptrace platform.)
		{name: "memory hog", timeoutS: 30, oomOK: true, cmd: `timeout 20 python3 -c 'x = b"a" * 600000000; print("survived", len(x))'`,
			check: func(t *testing.T, res session.ExecResult, err error) {
				if err == nil && strings.Contains(res.Stdout, "survived") {
					t.Errorf("the allocation survived a 256 MiB limit: %q", tail(res.Stdout))
				}
			}},
	}
}

func tail(s string) string {
	if len(s) > 400 {
		return "…" + s[len(s)-400:]
	}
	return s
}

func execTimed(ctx context.Context, n *node.Node, s *session.Session, cmd string, timeoutS int) (session.ExecResult, error) {
	b, _ := json.Marshal(cmd)
	return n.Exec(ctx, s, session.ExecRequest{Command: b, TimeoutS: &timeoutS}, nil, nil)
}

// TestExhaustion: a fork bomb, an fd bomb, a full disk, a CPU spin and a memory hog each stay
// inside their session, under runsc and under runc: after each, the session is still running
// (or failed with oom after the memory hog), another exec in it answers, another session on
// the same node is unaffected, and DELETE still works. Each attack gets a fresh session: what
// one leaves behind (under runsc a fork bomb leaves the sandbox's host threads, and their
// kernel memory, behind) is not the next one's to carry.
func TestExhaustion(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) {
			project := "proj_exhaust_" + rt
			d := newDriver(t, rt, tempDir(t))
			n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_exhaust_"+rt))
			tpl := catalog[templates.DevPolyglot]
			opts := sessionOpts{idleS: 900, lifeS: 1800, template: tpl.Name + "@" + tpl.Digest}
			neighbour := provision(t, st, n.Node, project, opts)
			guestLimits(t, n.Node, rt, neighbour)
			for _, a := range attacks() {
				t.Run(strings.ReplaceAll(a.name, " ", "_"), func(t *testing.T) {
					victim := provision(t, st, n.Node, project, opts)
					t0 := time.Now()
					res, err := execTimed(ctxT(t, time.Duration(a.timeoutS+30)*time.Second), n.Node, victim, a.cmd, a.timeoutS)
					t.Logf("%s %s: %.1fs, exit %d, stdout %q, stderr %q, err %v", rt, a.name, time.Since(t0).Seconds(), res.ExitCode, tail(res.Stdout), tail(res.Stderr), err)
					a.check(t, res, err)

					alive(t, n.Node, "the neighbour", neighbour)
					got := get(t, st, project, victim.ID)
					if a.oomOK {
						// The OOM kill's event reaches the node a moment after the exec's
						// answer: give it that moment before calling the session alive.
						for deadline := time.Now().Add(5 * time.Second); got.State == session.Running && time.Now().Before(deadline); {
							time.Sleep(poll)
							got = get(t, st, project, victim.ID)
						}
					}
					if a.oomOK && got.State != session.Running {
						end, _ := waitState(t, st, project, victim.ID, 30*time.Second, session.Failed, session.Stopped, session.Expired)
						checkEnded(t, end, session.Failed, session.OOM)
						t.Logf("%s: the memory hog failed its session with oom", rt)
						return
					}
					if got.State != session.Running {
						t.Fatalf("after the %s the session is %s %s, want running", a.name, got.State, reasonOf(got))
					}
					alive(t, n.Node, "the attacked session", victim)
					if got := get(t, st, project, victim.ID); got.State != session.Running {
						t.Fatalf("after the %s the session became %s %s, want running", a.name, got.State, reasonOf(got))
					}
					deleteSession(t, st, n.Node, project, victim.ID)
					if err := waitGuestGone(t, d, victim.ID, 30*time.Second); err != nil {
						t.Error(err)
					}
				})
			}
			alive(t, n.Node, "the neighbour", neighbour)
			deleteSession(t, st, n.Node, project, neighbour.ID)
			checkSlots(t, st, project)
		})
	}
}

// guestLimits: no guest process holds CAP_SYS_ADMIN (under runsc the agent holds it only to
// mount gVisor's pids cgroup, then drops it), and under runsc an exec's processes start in
// the agent's pids cgroup.
func guestLimits(t *testing.T, n *node.Node, rt string, s *session.Session) {
	t.Helper()
	res, err := execTimed(ctxT(t, 30*time.Second), n, s, "grep -E '^Cap(Bnd|Prm|Eff)' /proc/self/status; cat /proc/self/cgroup", 20)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("read the guest's capabilities: exit %d, %q, %v", res.ExitCode, res.Stderr, err)
	}
	for _, line := range strings.Split(res.Stdout, "\n") {
		name, hex, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "Cap") {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", name, line, err)
		}
		if caps&(1<<21) != 0 {
			t.Errorf("%s: a guest process holds CAP_SYS_ADMIN (%s)", rt, line)
		}
	}
	if inCgroup := strings.Contains(res.Stdout, "/wb-work"); inCgroup != (rt == "runsc") {
		t.Errorf("%s: an exec's cgroups:\n%s(want the agent's pids cgroup wb-work under runsc only)", rt, res.Stdout)
	}
	t.Logf("%s: a guest process's capabilities and cgroups:\n%s", rt, res.Stdout)
}

// alive waits (20 s at most) until an exec in s answers "alive". Until then an exec may be
// refused with the guest's clear "at its process limit" error (the agent ends a fork bomb
// that stays at the limit within seconds); anything else fails the test.
func alive(t *testing.T, n *node.Node, who string, s *session.Session) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := execTimed(ctxT(t, 30*time.Second), n, s, "echo alive", 20)
		if err == nil && res.ExitCode == 0 && res.Stdout == "alive\n" {
			return
		}
		atLimit := err == nil && res.ExitCode == 126 && strings.Contains(res.Stderr, "the guest is at its process limit")
		if !atLimit || time.Now().After(deadline) {
			t.Fatalf("%s: exec after the attack: exit %d, stdout %q, stderr %q, err %v", who, res.ExitCode, res.Stdout, tail(res.Stderr), err)
		}
		t.Logf("%s: exec refused for now: %s", who, strings.TrimSpace(res.Stderr))
		time.Sleep(500 * time.Millisecond)
	}
}

// deleteSession does what DELETE does: running → stopping (caller, deleted), then the node
// tears the guest down and the session stops.
func deleteSession(t *testing.T, st *store.Store, n *node.Node, project, id string) {
	t.Helper()
	s, err := st.Transition(ctxT(t, 10*time.Second), store.Change{Project: project, ID: id, From: session.Running,
		To: session.Stopping, Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
	if err := n.Stop(ctxT(t, time.Minute), s); err != nil {
		t.Fatalf("delete %s: node stop: %v", id, err)
	}
	end, _ := waitState(t, st, project, id, time.Minute, session.Stopped, session.Failed, session.Expired)
	checkEnded(t, end, session.Stopped, session.Deleted)
}

// TestGuestCrash: a guest that kills its own init (the agent) dies by its own doing while its
// host works: the session fails with guest_crash, never host_failure, under runsc and runc
// and in a cloudhv VM.
func TestGuestCrash(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	for _, rt := range []string{"runsc", "runc", "cloudhv"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			project := "proj_crash_" + rt
			d := newDriver(t, rt, tempDir(t))
			n := startNode(t, nodeConfig(t, st, d, tempDir(t), "node_crash_"+rt))
			s := provision(t, st, n.Node, project, sessionOpts{idleS: 300, lifeS: 600})
			// SIGTERM is the one signal PID 1 (the agent) takes from inside: it ends it.
			res, err := execIn(ctxT(t, 30*time.Second), n.Node, s, "kill -TERM 1; sleep 10")
			t.Logf("exec: exit %d, err %v", res.ExitCode, err)
			if err != nil && !strings.Contains(err.Error(), "reason guest_crash") {
				t.Errorf("the exec whose guest crashed under it: %v; want the error to name guest_crash", err)
			}
			end, _ := waitState(t, st, project, s.ID, 30*time.Second, session.Failed, session.Stopped, session.Expired)
			checkEnded(t, end, session.Failed, session.GuestCrash)
			checkSlots(t, st, project)
			if err := waitGuestGone(t, d, s.ID, 30*time.Second); err != nil {
				t.Errorf("the session failed with guest_crash but its guest was not torn down: %v", err)
			}
		})
	}
}
