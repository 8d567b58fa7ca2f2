package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/client"
)

// fakeAPI answers session creates and deletes, recording the deletes.
type fakeAPI struct {
	mu      sync.Mutex
	n       int
	deleted []string
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/sessions":
		f.n++
		w.WriteHeader(201)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "sess_fake" + string(rune('a'+f.n)), "object": "session", "state": "pending", "tier": 2})
	case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/v1/sessions/"):
		id := strings.TrimPrefix(r.URL.Path, "/v1/sessions/")
		f.deleted = append(f.deleted, id)
		w.WriteHeader(202)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "session", "state": "stopping"})
	default:
		w.WriteHeader(404)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": "not_found", "code": "not_found", "message": "no route"}})
	}
}

func fakeRow(name string, check func(ctx context.Context, e *Env) (string, error)) Row {
	return Row{Seed: "000", Table: "Fake", Row: name, Check: check}
}

// TestRunOutcomes: each kind of row ends as it should, in the suite's order, and what a
// failing (or panicking, or timed-out) row made is deleted all the same.
func TestRunOutcomes(t *testing.T) {
	api := &fakeAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	rows := []Row{
		fakeRow("pass", func(context.Context, *Env) (string, error) { return "saw it", nil }),
		fakeRow("fail after a create", func(ctx context.Context, e *Env) (string, error) {
			s, err := e.CreateSession(ctx, client.CreateSessionRequest{Tier: 2})
			if err != nil {
				return "", err
			}
			return "made " + s.ID, errors.New("wanted something else")
		}),
		fakeRow("panic after a create", func(ctx context.Context, e *Env) (string, error) {
			if _, err := e.CreateSession(ctx, client.CreateSessionRequest{Tier: 2}); err != nil {
				return "", err
			}
			var m map[string]int
			m["x"] = 1 // a bug in a check must fail its row, not the run
			return "", nil
		}),
		{Seed: "000", Table: "Fake", Row: "timeout", Timeout: func(Timers) time.Duration { return 50 * time.Millisecond },
			Check: func(ctx context.Context, e *Env) (string, error) {
				<-ctx.Done()
				return "", ctx.Err()
			}},
		{Seed: "000", Table: "Fake", Row: "long", Long: true, Check: func(context.Context, *Env) (string, error) { return "ran", nil }},
		{Seed: "001", Table: "Fake", Row: "unreachable", Skip: "not through the API"},
	}
	rep, err := Run(context.Background(), Options{URL: srv.URL, Key: "k", Rows: rows})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		status Status
		saw    string
	}{
		{Pass, "saw it"},
		{Fail, "; wanted something else"},
		{Fail, "the check panicked"},
		{Fail, "the row's timeout is 50ms"},
		{Skip, "skipped (needs --long)"},
		{Skip, "skipped (not through the API)"},
	}
	for i, w := range want {
		got := rep.Results[i]
		if got.Status != w.status || !strings.Contains(got.Saw, w.saw) {
			t.Errorf("row %q: %s %q, want %s containing %q", got.Row, got.Status, got.Saw, w.status, w.saw)
		}
	}
	if rep.Passed != 1 || rep.Failed != 3 || rep.Skipped != 2 || rep.OK() {
		t.Errorf("counts %d/%d/%d, OK %v", rep.Passed, rep.Failed, rep.Skipped, rep.OK())
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.deleted) != 2 {
		t.Errorf("deleted %v, want both sessions the failing rows made", api.deleted)
	}

	// --long runs the long row; a filter keeps only the rows it matches.
	rep, err = Run(context.Background(), Options{URL: srv.URL, Key: "k", Rows: rows, Long: true, Filter: regexp.MustCompile(`/long$`)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 1 || rep.Results[0].Status != Pass || rep.Timers != longTimers || !rep.OK() {
		t.Errorf("--long with a filter: %+v", rep)
	}
}

// TestRunBoundsParallelism: never more rows at once than Parallel, and more than one.
func TestRunBoundsParallelism(t *testing.T) {
	var now, most atomic.Int32
	var rows []Row
	for range 12 {
		rows = append(rows, fakeRow("r", func(ctx context.Context, _ *Env) (string, error) {
			n := now.Add(1)
			defer now.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			return "", sleepCtx(ctx, 20*time.Millisecond) // the point: overlap, if allowed
		}))
	}
	if _, err := Run(context.Background(), Options{URL: "http://127.0.0.1:1", Key: "k", Rows: rows, Parallel: 3}); err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m > 3 || m < 2 {
		t.Errorf("at most %d rows ran at once, want 2–3 with Parallel 3", m)
	}
}

func TestSharedSetupMadeOnce(t *testing.T) {
	var made atomic.Int32
	check := func(ctx context.Context, e *Env) (string, error) {
		v, err := shared(ctx, e, "x", func(context.Context, *Env) (int, error) { return int(made.Add(1)), nil })
		if v != 1 {
			return "", errors.New("a second setup")
		}
		return "", err
	}
	rep, err := Run(context.Background(), Options{URL: "http://127.0.0.1:1", Key: "k",
		Rows: []Row{fakeRow("a", check), fakeRow("b", check), fakeRow("c", check)}})
	if err != nil {
		t.Fatal(err)
	}
	if made.Load() != 1 || !rep.OK() {
		t.Errorf("setup made %d times; %s", made.Load(), rep.Summary())
	}
}

func TestWriteTable(t *testing.T) {
	rep := Report{Timers: shortTimers, Duration: 83 * time.Second, Passed: 1, Failed: 1, Skipped: 1, Results: []Result{
		{Seed: "000", Table: "States", Row: "running", Status: Pass, Saw: "session_s 0 → 3"},
		{Seed: "000", Table: "Pause limits", Row: "tier 1", Status: Fail, Saw: "200\nok"},
		{Seed: "001", Table: "Transitions", Row: "any | Delete | gone", Status: Skip, Saw: "skipped (needs --long)"},
	}}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"SEED  TABLE         ROW                  RESULT  SAW\n" +
		"000   States        running              PASS    session_s 0 → 3\n" +
		"000   Pause limits  tier 1               FAIL    200 ok\n" +
		"001   Transitions   any | Delete | gone  SKIP    skipped (needs --long)\n" +
		"FAIL: 1 passed, 1 failed, 1 skipped of 3 rows; short (idle_timeout_s 30, max_lifetime_s 60); 1m23s\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestRowsNamed: every row names its seed, table and row, and names are unique (--run picks
// rows by them).
func TestRowsNamed(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Rows() {
		if (r.Seed != "000" && r.Seed != "001") || r.Table == "" || r.Row == "" || (r.Check == nil && r.Skip == "") {
			t.Errorf("row %+v: want seed 000 or 001, a table, a row, and a check or a reason to skip", r.Name())
		}
		if seen[r.Name()] {
			t.Errorf("two rows named %q", r.Name())
		}
		seen[r.Name()] = true
	}
}

// TestSerialRowsRunAlone: a serial row (one that changes the project's spend cap) runs after
// every other row has ended, and keeps its place in the report.
func TestSerialRowsRunAlone(t *testing.T) {
	var running, done atomic.Int32
	other := fakeRow("other", func(ctx context.Context, _ *Env) (string, error) {
		running.Add(1)
		defer running.Add(-1)
		defer done.Add(1)
		return "", sleepCtx(ctx, 20*time.Millisecond) // the point: still running if the serial row started early
	})
	serial := Row{Seed: "000", Table: "Fake", Row: "serial", Serial: true, Check: func(context.Context, *Env) (string, error) {
		if running.Load() != 0 || done.Load() != 4 {
			return "", errors.New("ran beside other rows")
		}
		return "alone", nil
	}}
	rep, err := Run(context.Background(), Options{URL: "http://127.0.0.1:1", Key: "k", Rows: []Row{other, serial, other, other, other}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Results[1]; got.Row != "serial" || got.Status != Pass {
		t.Errorf("the serial row: %+v", got)
	}
}
