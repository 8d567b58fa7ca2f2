package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"wb/desktop"
	"wb/session"
)

// heapPeak samples the live heap objects of this process until stop is called, and answers
// the highest figure seen.
func heapPeak(t *testing.T) (stop func() uint64) {
	t.Helper()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak uint64
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, sample[0].Value.Uint64())
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(quit); <-done; return peak }
}

// yes through a buffered exec: the answer keeps MaxOutputBytes, says truncated and counts every
// byte, and the gateway's heap stays flat while the command writes ~100× the cap. The guest is
// a real agent (fakenode) running the host's yes.
func TestBufferedExecOutputIsCapped(t *testing.T) {
	const maxOut = 1 << 20
	const total = 64 << 20
	e := newEnv(t, func(c *Config) { c.MaxOutputBytes = maxOut })
	s := e.running(map[string]any{"tier": 2})
	// Warm up (connections, the agent), then measure from a collected heap.
	e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"}, 200, nil)
	var base [1]metrics.Sample
	base[0].Name = "/memory/classes/heap/objects:bytes"
	// A low GOGC keeps garbage from hiding what is live: the peak is then close to the live heap.
	defer debug.SetGCPercent(debug.SetGCPercent(20))
	runtime.GC()
	metrics.Read(base[:])
	stop := heapPeak(t)
	var res session.ExecResult
	e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{
		"command": "yes | head -c " + strconv.Itoa(total) + "; yes e | head -c 3000000 >&2", "timeout_s": 600}, 200, &res)
	peak := stop()
	if !res.Truncated || res.StdoutBytes != total || res.StderrBytes != 3000000 || len(res.Stdout) != maxOut || len(res.Stderr) != maxOut ||
		!strings.HasPrefix(res.Stdout, "y\ny\n") || res.ExitCode != 0 {
		t.Fatalf("truncated %v stdout %d of %d bytes, stderr %d of %d, exit %d", res.Truncated, len(res.Stdout), res.StdoutBytes, len(res.Stderr), res.StderrBytes, res.ExitCode)
	}
	grew := int64(peak) - int64(base[0].Value.Uint64())
	t.Logf("heap: %d MiB before, peak %d MiB (+%d MiB) while the command wrote %d MiB", base[0].Value.Uint64()>>20, peak>>20, grew>>20, total>>20)
	if grew > 40<<20 {
		t.Fatalf("the heap grew by %d MiB for a %d MiB cap: output is being kept", grew>>20, maxOut>>20)
	}
	// A run stores the same bounded result.
	var run session.Run
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "yes | head -c 3000000"}, 201, &run)
	if !run.Truncated || run.StdoutBytes != 3000000 || len(run.Stdout) != maxOut {
		t.Fatalf("run: truncated %v, %d of %d bytes", run.Truncated, len(run.Stdout), run.StdoutBytes)
	}
	e.mustDo("GET", "/v1/runs/"+run.ID, e.key, nil, 200, &run)
	if !run.Truncated || len(run.Stdout) != maxOut {
		t.Fatalf("stored run: truncated %v, %d bytes", run.Truncated, len(run.Stdout))
	}
	// Small output is whole and says so.
	e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "echo hi"}, 200, &res)
	if res.Truncated || res.Stdout != "hi\n" || res.StdoutBytes != 3 {
		t.Fatalf("%+v", res)
	}
}

// A run.finished event carries at most eventOutputBytes of each stream, cut where it keeps
// UTF-8 whole, with truncated and the full byte counts; GET /v1/runs/{id} keeps all of it.
func TestRunFinishedEventOutputIsCut(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	// "é\n" is 3 bytes, so the bound falls inside an "é".
	const outN, errN = 200000, 100000
	var run session.Run
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID,
		"command": "yes é | head -c " + strconv.Itoa(outN) + "; yes e | head -c " + strconv.Itoa(errN) + " >&2"}, 201, &run)
	e.mustDo("GET", "/v1/runs/"+run.ID, e.key, nil, 200, &run)
	if len(run.Stdout) != outN || len(run.Stderr) != errN || run.Truncated {
		t.Fatalf("stored run: stdout %d bytes, stderr %d, truncated %v; want all of it", len(run.Stdout), len(run.Stderr), run.Truncated)
	}
	evs, err := e.st.OutboxEvents(context.Background(), e.projA)
	if err != nil {
		t.Fatal(err)
	}
	var got *session.Run
	for _, ev := range evs {
		if ev.Type == session.EventRunFinished {
			got = new(session.Run)
			if err := json.Unmarshal(ev.Object, got); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got == nil || got.ID != run.ID {
		t.Fatalf("no run.finished event for %s: %+v", run.ID, got)
	}
	wantOut := eventOutputBytes - eventOutputBytes%3 // whole "é\n"s only
	if !got.Truncated || got.StdoutBytes != outN || got.StderrBytes != errN ||
		len(got.Stdout) != wantOut || !utf8.ValidString(got.Stdout) || got.Stdout != run.Stdout[:wantOut] ||
		len(got.Stderr) != eventOutputBytes || got.Stderr != run.Stderr[:eventOutputBytes] {
		t.Fatalf("event run: truncated %v, stdout %d of %d bytes (valid UTF-8 %v), stderr %d of %d; want true, %d of %d, %d of %d",
			got.Truncated, len(got.Stdout), got.StdoutBytes, utf8.ValidString(got.Stdout), len(got.Stderr), got.StderrBytes,
			wantOut, outN, eventOutputBytes, errN)
	}
}

// An answer too big to keep for an Idempotency-Key replay is not kept: the retry gets a 409
// that says so, and the command does not run again.
func TestIdempotencyReplayIsBounded(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxOutputBytes = 64 << 10; c.MaxReplayBytes = 32 << 10 })
	s := e.running(map[string]any{"tier": 2})
	marker := filepath.Join(t.TempDir(), "ran")
	body := map[string]any{"command": "echo x >> " + marker + "; yes | head -c 100000"}
	r := e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, body, 200, nil, "Idempotency-Key", "big-1")
	if len(r.body) < 64<<10 {
		t.Fatalf("first answer %d bytes", len(r.body))
	}
	msg := expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, body, "Idempotency-Key", "big-1"), 409, "replay_too_large", "")
	if !strings.Contains(msg, "not run again") {
		t.Fatal(msg)
	}
	if b, _ := os.ReadFile(marker); string(b) != "x\n" {
		t.Fatalf("the command ran %d times", strings.Count(string(b), "x"))
	}
	// A small answer still replays.
	r = e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "echo small"}, 200, nil, "Idempotency-Key", "small-1")
	again := e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "echo small"}, 200, nil, "Idempotency-Key", "small-1")
	if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, r.body) {
		t.Fatalf("replay %q: %s", again.header.Get("Idempotent-Replayed"), again.body)
	}
}

// Execs in progress and async runs per project are capped; past the cap, 429 with
// Retry-After; another project is not affected; a slot frees when its work ends.
func TestExecAndRunCaps(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConcurrentExecs = 2; c.MaxAsyncRuns = 1 })
	s := e.running(map[string]any{"tier": 2})
	gate := filepath.Join(t.TempDir(), "go")
	waitGate := "while [ ! -e " + gate + " ]; do sleep 0.02; done; echo done"
	post := func(path string, body any) (int, []byte) {
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", e.url+path, bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.Bytes()
	}
	var wg sync.WaitGroup
	statuses := make(chan int, 2)
	for range 2 {
		wg.Go(func() {
			st, _ := post("/v1/sessions/"+s.ID+"/exec", map[string]any{"command": waitGate, "timeout_s": 600})
			statuses <- st
		})
	}
	inFlight := func(ps *projectSlots) int {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		return ps.n[e.projA]
	}
	deadline := time.Now().Add(60 * time.Second)
	for inFlight(e.gw.execs) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two execs never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"})
	msg := expectError(t, r, 429, "too_many_execs", "")
	if r.header.Get("Retry-After") != "1" || !strings.Contains(msg, "2 execs in progress") {
		t.Fatalf("Retry-After %q: %s", r.header.Get("Retry-After"), msg)
	}
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "true"}), 429, "too_many_execs", "")
	// The async-run cap is its own: one queued or running run.
	var run session.Run
	e.mustDo("POST", "/v1/runs?wait=false", e.key, map[string]any{"session_id": s.ID, "command": waitGate, "timeout_s": 600}, 202, &run)
	r = e.do("POST", "/v1/runs?wait=false", e.key, map[string]any{"session_id": s.ID, "command": "true"})
	if msg := expectError(t, r, 429, "too_many_runs", ""); r.header.Get("Retry-After") == "" || !strings.Contains(msg, "1 async run") {
		t.Fatalf("Retry-After %q: %s", r.header.Get("Retry-After"), msg)
	}
	// Another project is not affected.
	_, keyB := e.newProject("B", nil)
	var sb session.Session
	e.mustDo("POST", "/v1/sessions", keyB, map[string]any{"tier": 2}, 201, &sb)
	e.waitState(keyB, sb.ID, session.Running)
	e.mustDo("POST", "/v1/sessions/"+sb.ID+"/exec", keyB, map[string]any{"command": "true"}, 200, nil)
	// Let the work end: the slots free.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for range 2 {
		if st := <-statuses; st != 200 {
			t.Fatalf("a held exec answered %d", st)
		}
	}
	deadline = time.Now().Add(60 * time.Second)
	for inFlight(e.gw.asyncRuns) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the async run never finished")
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"}, 200, nil)
	e.mustDo("POST", "/v1/runs?wait=false", e.key, map[string]any{"session_id": s.ID, "command": "true"}, 202, &run)
	deadline = time.Now().Add(60 * time.Second)
	for run.State != session.RunSucceeded {
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %s", run.ID, run.State)
		}
		time.Sleep(5 * time.Millisecond)
		e.mustDo("GET", "/v1/runs/"+run.ID, e.key, nil, 200, &run)
	}
}

// TestDesktopMCPExecsAreCapped: the desktop MCP's run_command and run_js count among the
// project's execs (Config.MaxConcurrentExecs), as the exec route does: past the cap a call is
// a tool error naming the limit, and a call in progress holds a slot the exec route sees.
// A desktop's setup, the gateway's own exec, is not refused for the project's load. Before,
// the tools called the exec path directly: an agent could start any number of execs at once.
func TestDesktopMCPExecsAreCapped(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrentExecs = 1
		c.DesktopSetup = func(ctx context.Context, ex desktop.Execer) error {
			_, stderr, code, err := ex.Exec(ctx, []string{"true"}, nil)
			if err == nil && code != 0 {
				err = fmt.Errorf("setup exited %d: %s", code, stderr)
			}
			return err
		}
	})
	d := e.newDesktop(map[string]any{"name": "d"})
	s := e.running(map[string]any{"tier": 2})
	gate := filepath.Join(t.TempDir(), "go")
	waitGate := "while [ ! -e " + gate + " ]; do sleep 0.02; done; echo done"
	// A failed test ends its held commands before the environment's cleanup waits for them.
	t.Cleanup(func() { _ = os.WriteFile(gate, nil, 0o644) })
	inFlight := func() int {
		e.gw.execs.mu.Lock()
		defer e.gw.execs.mu.Unlock()
		return e.gw.execs.n[e.projA]
	}
	waitInFlight := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); inFlight() < 1; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s never took an exec slot", what)
			}
		}
	}
	// An exec of the route holds the project's one slot.
	held := make(chan int, 1)
	go func() {
		raw, _ := json.Marshal(map[string]any{"command": waitGate, "timeout_s": 600})
		req, _ := http.NewRequest("POST", e.url+"/v1/sessions/"+s.ID+"/exec", bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- 0
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	waitInFlight("the exec route")
	cs := e.mcpSession(d)
	for name, args := range map[string]map[string]any{
		"run_command": {"command": "echo ran"},
		"run_js":      {"script": "1+1"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		cancel()
		if err != nil || !res.IsError || !strings.Contains(textOf(res), "1 execs in progress") {
			t.Errorf("%s with an exec in progress and a cap of 1: %v, %s; want a tool error naming the limit", name, err, describeResult(res))
		}
	}
	// A desktop's setup is the gateway's own exec: a tenant's execs do not fail its start.
	e.newDesktop(map[string]any{"name": "d2"})
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if status := <-held; status != 200 {
		t.Fatalf("the held exec answered %d", status)
	}
	// Its answer may reach the caller before its handler has returned the slot (the answer
	// is flushed as it is written).
	for deadline := time.Now().Add(time.Minute); inFlight() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the held exec's slot was never returned")
		}
	}
	// The other way: a run_command in progress holds the slot from the exec route.
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": waitGate, "timeout_s": 600}})
		if err == nil && res.IsError {
			err = fmt.Errorf("tool error: %s", textOf(res))
		}
		done <- err
	}()
	waitInFlight("run_command")
	r := e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"})
	if msg := expectError(t, r, 429, "too_many_execs", ""); !strings.Contains(msg, "1 execs in progress") {
		t.Errorf("the exec route with a run_command in progress: %s", msg)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the held run_command: %v", err)
	}
	res := callTool(t, cs, "run_command", map[string]any{"command": "echo ran"})
	if !strings.Contains(textOf(res), `"stdout":"ran\n"`) {
		t.Errorf("run_command once the slot is free: %s", textOf(res))
	}
}

// describeResult prints a tool's result for a test's failure.
func describeResult(res *mcp.CallToolResult) string {
	if res == nil {
		return "no result"
	}
	return fmt.Sprintf("isError %v: %s", res.IsError, textOf(res))
}

// TestFullCapAnswersMissingSessionNotFound: with a project's exec, file and PTY caps full, a
// call for a session (or desktop) that is not there, or is another project's, answers 404
// as it would with room, and a call for one that is there answers the cap's 429. Before,
// the slot was taken before the session was looked up, and a missing one answered 429.
func TestFullCapAnswersMissingSessionNotFound(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConcurrentExecs, c.MaxConcurrentFileCalls, c.MaxConcurrentPTYs = 1, 1, 1 })
	s := e.running(map[string]any{"tier": 2})
	_, keyB := e.newProject("B", nil)
	other := e.create(keyB, map[string]any{"tier": 2}).ID
	// The caps are full: a slot of each is held as work in progress would.
	for _, ps := range []*projectSlots{e.gw.execs, e.gw.fileCalls, e.gw.ptys} {
		if err := ps.acquire(e.projA, 1); err != nil {
			t.Fatal(err)
		}
		defer ps.release(e.projA)
	}
	pty := func(id string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + id + "/pty"
		c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
		if err == nil {
			c.CloseNow()
			t.Fatalf("a PTY of %s opened with the cap full", id)
		}
		if resp == nil {
			t.Fatalf("a PTY of %s: %v", id, err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, id := range []string{"sess_0VcQ9aBcDeFgHiJkLm", other} {
		expectError(t, e.do("POST", "/v1/sessions/"+id+"/exec", e.key, map[string]any{"command": "true"}), 404, "not_found", "")
		expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"session_id": id, "command": "true"}), 404, "not_found", "")
		expectError(t, e.do("GET", "/v1/sessions/"+id+"/files?path=/etc/hostname", e.key, nil), 404, "not_found", "")
		expectError(t, e.do("PUT", "/v1/sessions/"+id+"/files?path=/tmp/x", e.key, []byte(`"x"`)), 404, "not_found", "")
		expectError(t, e.do("DELETE", "/v1/sessions/"+id+"/files?path=/tmp/x", e.key, nil), 404, "not_found", "")
		if status, body := pty(id); status != 404 || !strings.Contains(body, `"not_found"`) {
			t.Errorf("a PTY of the missing session %s with the cap full: %d %s; want 404 not_found", id, status, body)
		}
	}
	expectError(t, e.do("GET", "/v1/desktops/dsk_0VcQ9aBcDeFgHiJkLm/files?path=/etc/hostname", e.key, nil), 404, "not_found", "")
	expectError(t, e.do("GET", "/v1/desktops/dsk_0VcQ9aBcDeFgHiJkLm/screen", e.key, nil), 404, "not_found", "")
	// A session that is there waits its turn.
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"}), 429, "too_many_execs", "")
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "true"}), 429, "too_many_execs", "")
	expectError(t, e.do("GET", "/v1/sessions/"+s.ID+"/files?path=/etc/hostname", e.key, nil), 429, "too_many_file_calls", "")
	if status, body := pty(s.ID); status != 429 || !strings.Contains(body, `"too_many_ptys"`) {
		t.Errorf("a PTY of a running session with the cap full: %d %s; want 429 too_many_ptys", status, body)
	}
}

// TestFullCapAnswersInvalidRequestBadRequest: with a project's exec, async run, file and PTY
// caps full, a request that is invalid in itself (a field out of range, a missing path)
// answers its 400 naming the field, as it would with room, not the cap's 429: a caller
// that retried it after Retry-After would be refused again and again. Before, the slot was
// taken before those fields were checked.
func TestFullCapAnswersInvalidRequestBadRequest(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrentExecs, c.MaxAsyncRuns, c.MaxConcurrentFileCalls, c.MaxConcurrentPTYs = 1, 1, 1, 1
	})
	s := e.running(map[string]any{"tier": 2})
	d := e.newDesktop(map[string]any{"name": "d"})
	for _, ps := range []*projectSlots{e.gw.execs, e.gw.asyncRuns, e.gw.fileCalls, e.gw.ptys} {
		if err := ps.acquire(e.projA, 1); err != nil {
			t.Fatal(err)
		}
		defer ps.release(e.projA)
	}
	sp := "/v1/sessions/" + s.ID
	expectError(t, e.do("POST", sp+"/exec", e.key, map[string]any{"command": "true", "timeout_s": 0}), 400, "invalid_request", "timeout_s")
	expectError(t, e.do("POST", sp+"/exec", e.key, map[string]any{"command": ""}), 400, "invalid_request", "command")
	expectError(t, e.do("POST", sp+"/exec", e.key, map[string]any{"command": "true", "timeout_s": 0}, "Accept", "application/x-ndjson"), 400, "invalid_request", "timeout_s")
	expectError(t, e.do("POST", "/v1/runs?wait=false", e.key, map[string]any{"tier": 1, "runtime": "python3", "code": "print(1)", "end_user_id": strings.Repeat("u", 1000)}),
		400, "invalid_request", "end_user_id")
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "python3", "code": "print(1)", "end_user_id": strings.Repeat("u", 1000)}),
		400, "invalid_request", "end_user_id")
	for _, p := range []string{sp + "/files", "/v1/desktops/" + d.ID + "/files"} {
		expectError(t, e.do("GET", p, e.key, nil), 400, "invalid_request", "path")
		expectError(t, e.do("PUT", p, e.key, []byte(`"x"`)), 400, "invalid_request", "path")
		expectError(t, e.do("DELETE", p, e.key, nil), 400, "invalid_request", "path")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := "ws" + strings.TrimPrefix(e.url, "http") + sp + "/pty?cols=0"
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
	if err == nil {
		c.CloseNow()
		t.Fatal("a PTY with cols=0 opened")
	}
	if resp == nil {
		t.Fatalf("a PTY with cols=0: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"cols"`) {
		t.Errorf("a PTY with cols=0 and the cap full: %d %s; want 400 naming cols", resp.StatusCode, b)
	}
	// Valid, the same calls wait their turn.
	expectError(t, e.do("POST", sp+"/exec", e.key, map[string]any{"command": "true", "timeout_s": 5}), 429, "too_many_execs", "")
	expectError(t, e.do("POST", "/v1/runs?wait=false", e.key, map[string]any{"tier": 1, "runtime": "python3", "code": "print(1)"}), 429, "too_many_runs", "")
	expectError(t, e.do("GET", sp+"/files?path=/etc/hostname", e.key, nil), 429, "too_many_file_calls", "")
}

// TestAbortedRequestIsCounted: a request whose answer breaks off (here a file read whose
// caller hangs up mid-answer, which the handler ends with net/http's abort) is counted and
// timed in /metrics, under the status its caller got; one aborted before any status is
// counted too. Before, the abort's panic passed the counting by, and such requests were
// missing from the request metrics.
func TestAbortedRequestIsCounted(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "head -c 268435456 /dev/zero > big", "timeout_s": 600}, 200, nil)
	req, _ := http.NewRequest("GET", e.url+"/v1/sessions/"+s.ID+"/files?path=big", nil)
	req.Header.Set("Authorization", "Bearer "+e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<16)); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the read's start: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close() // hangs up mid-answer
	want := []string{
		`wb_http_requests_total{method="GET",route="GET /v1/sessions/{id}/files",status="200"} 1`,
		`wb_http_request_duration_seconds_count{method="GET",route="GET /v1/sessions/{id}/files",status="200"} 1`,
	}
	var got string
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		got = string(e.do("GET", "/metrics", adminKey, nil).body)
		if strings.Contains(got, want[0]) && strings.Contains(got, want[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 min after its caller hung up, /metrics has no aborted file read; want\n%s\nin:\n%s", strings.Join(want, "\n"), grepLines(got, "wb_http_request"))
		}
	}

	// Aborted before any status: counted under status 0 (no answer).
	m := NewMetrics(nil)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /abort", func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })
	srv := httptest.NewServer(m.instrument(mux))
	defer srv.Close()
	if resp, err := http.Get(srv.URL + "/abort"); err == nil {
		resp.Body.Close()
		t.Fatalf("an aborted request answered %d", resp.StatusCode)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if want := `wb_http_requests_total{method="GET",route="GET /abort",status="0"} 1`; !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("/metrics after a request aborted before its status: want %s in:\n%s", want, grepLines(rec.Body.String(), "wb_http_request"))
	}
}

// grepLines answers the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for line := range strings.Lines(text) {
		if strings.Contains(line, s) && !strings.HasPrefix(line, "#") {
			out = append(out, strings.TrimSuffix(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}

// TestMethodLabelIsBounded: a request's method is a label of the request metrics only when
// it is one of HTTP's; any other counts as "other". Before, a caller needed no key to add a
// series (and a histogram's) to wb_http_requests_total with every method it made up.
func TestMethodLabelIsBounded(t *testing.T) {
	e := newEnv(t)
	const n = 50
	for i := range n {
		req, _ := http.NewRequest(fmt.Sprintf("X%d", i), e.url+"/v1/sessions", nil) // no key
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	got := grepLines(string(e.do("GET", "/metrics", adminKey, nil).body), "wb_http_requests_total{")
	if series := strings.Count(got, `route="unmatched"`); series != 1 || !strings.Contains(got, `method="other",route="unmatched",status="404"} 50`) {
		t.Fatalf("%d requests of made-up methods made %d series; want one, of method \"other\":\n%s", n, series, got)
	}
}
