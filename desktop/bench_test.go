package desktop_test

import (
	"slices"
	"testing"
	"time"

	"wb/desktop"
	"wb/session"
)

// BenchmarkDesktopSleepWake measures, with a real runsc guest (tpl_base), a desktop's sleep
// (POST :sleep until asleep: a disk snapshot, a memory snapshot, the session stopped) and the
// latency from an MCP tool call to an asleep desktop to its answer (the wake from the memory
// snapshot, the wait, the call). Beside them, in the same run and on the same guest, the
// baseline through the sessions API: a snapshot with memory, and a session restored from it
// until its first exec answers (while the desktop sleeps: a project's share of the test's node
// holds one small guest). Each iteration is one sleep and one wake, so run it with a few
// iterations (-benchtime 5x); p99 of so few is their slowest.
func BenchmarkDesktopSleepWake(b *testing.B) {
	p := startPlatform(b, nil)
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "bench"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)
	cs := p.mcpClient(d, nil, nil)
	command(b, cs, "true")

	var sleeps, wakes, snaps, restores []time.Duration
	for b.Loop() {
		t0 := time.Now()
		p.call("POST", "/v1/desktops/"+d.ID+":sleep", nil, 202, nil)
		p.waitFast(d.ID, desktop.Asleep)
		sleeps = append(sleeps, time.Since(t0))

		snap, restore := p.baseline()
		snaps, restores = append(snaps, snap), append(restores, restore)

		t0 = time.Now()
		command(b, cs, "true")
		wakes = append(wakes, time.Since(t0))
	}
	report(b, "sleep", sleeps)
	report(b, "wake-to-mcp-answer", wakes)
	report(b, "baseline-snapshot-mem", snaps)
	report(b, "baseline-restore-to-exec", restores)
}

// baseline times, through the sessions API, a snapshot with memory of a running session of
// the desktops' tier and size, and a session restored from it until its first exec answers.
func (p *platform) baseline() (snapshot, restore time.Duration) {
	p.t.Helper()
	size := map[string]any{"size_class": "s"}
	var s session.Session
	p.call("POST", "/v1/sessions", map[string]any{"tier": 4, "template": "tpl_base", "resources": size}, 201, &s)
	p.waitSession(s.ID, session.Running)
	p.call("POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"command": "true"}, 200, nil)
	t0 := time.Now()
	var snap session.Snapshot
	p.call("POST", "/v1/sessions/"+s.ID+":snapshot", map[string]any{"include_memory": true}, 201, &snap)
	snapshot = time.Since(t0)
	if !snap.IncludeMemory {
		p.t.Fatalf("the baseline's snapshot has no memory: %+v", snap)
	}
	p.call("DELETE", "/v1/sessions/"+s.ID, nil, 202, nil)
	p.waitSession(s.ID, session.Stopped)

	t0 = time.Now()
	p.call("POST", "/v1/sessions", map[string]any{"tier": 4, "restore_from": snap.ID, "resources": size}, 201, &s)
	p.waitSession(s.ID, session.Running)
	p.call("POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"command": "true"}, 200, nil)
	restore = time.Since(t0)
	p.call("DELETE", "/v1/sessions/"+s.ID, nil, 202, nil)
	p.waitSession(s.ID, session.Stopped)
	p.call("DELETE", "/v1/snapshots/"+snap.ID, nil, 200, nil)
	return snapshot, restore
}

// report adds the p50 and p99 of ds, in milliseconds, to the benchmark's line.
func report(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	b.ReportMetric(float64(at(0.50))/float64(time.Millisecond), name+"-p50-ms")
	b.ReportMetric(float64(at(0.99))/float64(time.Millisecond), name+"-p99-ms")
}

// waitFast polls the desktop every 10 ms until it is in want (for timing).
func (p *platform) waitFast(id string, want desktop.State) {
	p.t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if d := p.get(id); d.State == want {
			return
		} else if d.State == desktop.Failed {
			p.t.Fatalf("desktop failed: %s", d.Message)
		}
	}
	p.t.Fatalf("desktop %s never became %s", id, want)
}

// waitSession polls the session every 10 ms until it is in want.
func (p *platform) waitSession(id string, want session.State) session.Session {
	p.t.Helper()
	var s session.Session
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		p.call("GET", "/v1/sessions/"+id, nil, 200, &s)
		if s.State == want {
			return s
		}
		if s.State.Terminal() {
			reason := "no reason recorded"
			if s.StateReason != nil {
				reason = string(*s.StateReason)
			}
			p.t.Fatalf("session %s ended: %s", id, reason)
		}
	}
	p.t.Fatalf("session %s is %s, want %s", id, s.State, want)
	return s
}
