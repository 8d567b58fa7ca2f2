package desktop

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"wb/session"
)

// seedRows is seed 001's table "Transitions", written out independently of rules: from,
// cause, the state entered at once, and the state it ends in ("" for gone).
var seedRows = []struct {
	from       []State
	causes     []Cause
	now, final State
}{
	{[]State{""}, []Cause{Create}, Starting, Running},              // (none) Create → starting, then running
	{[]State{Running}, []Cause{Sleep, Idle}, Stopping, Asleep},     // running: Sleep, or 15 minutes without use
	{[]State{Asleep}, []Cause{MCP, Wake, File}, Starting, Running}, // asleep: an MCP call, Wake, or a file sent or saved
	{[]State{Running, Starting}, []Cause{Stop}, Stopping, Stopped}, // running or starting: Stop
	{[]State{Asleep}, []Cause{Stop}, Stopped, Stopped},             // asleep: Stop → stopped; snapshot discarded
	{[]State{Stopped}, []Cause{Start}, Starting, Running},          // stopped: Start
	{States(), []Cause{Delete}, "", ""},                            // any: Delete → gone
}

// additions are the rows beyond the seed's: completions and what the seed implies.
var additions = []struct {
	from      State
	cause     Cause
	now, last State
}{
	{Starting, Ready, Running, Running},
	{Starting, StartFailed, Failed, Failed},
	{Failed, Start, Starting, Running},
	{Running, SessionEnded, Stopped, Stopped},
}

func TestSeedTransitions(t *testing.T) {
	for _, row := range seedRows {
		for _, from := range row.from {
			for _, c := range row.causes {
				now, to, err := Next(from, c)
				if err != nil || now != row.now || to != row.final {
					t.Errorf("%q + %s: got %q then %q (%v), want %q then %q", from, c, now, to, err, row.now, row.final)
				}
			}
		}
	}
	for _, a := range additions {
		now, to, err := Next(a.from, a.cause)
		if err != nil || now != a.now || to != a.last {
			t.Errorf("%s + %s: got %q then %q (%v), want %q then %q", a.from, a.cause, now, to, err, a.now, a.last)
		}
	}
	for _, to := range []State{Asleep, Stopped} {
		if err := Halt(Stopping, to); err != nil {
			t.Errorf("stopping → %s: %v", to, err)
		}
		if err := Halt(Running, to); err == nil {
			t.Errorf("running → %s by halted: allowed", to)
		}
	}
	if err := Halt(Stopping, Failed); err == nil {
		t.Error("stopping → failed by halted: allowed")
	}
}

// TestEveryOtherRequestIs409: any (state, cause) pair outside the rows above answers a
// *StateError whose message names the state (the gateway's 409 invalid_state).
func TestEveryOtherRequestIs409(t *testing.T) {
	allowed := map[State][]Cause{}
	for _, row := range seedRows {
		for _, f := range row.from {
			allowed[f] = append(allowed[f], row.causes...)
		}
	}
	for _, a := range additions {
		allowed[a.from] = append(allowed[a.from], a.cause)
	}
	causes := []Cause{Create, Sleep, Idle, Wake, MCP, File, Stop, Start, Delete, Ready, StartFailed, SessionEnded}
	checked := 0
	for _, from := range append([]State{""}, States()...) {
		for _, c := range causes {
			_, _, err := Next(from, c)
			if slices.Contains(allowed[from], c) {
				if err != nil {
					t.Errorf("%q + %s: %v", from, c, err)
				}
				continue
			}
			checked++
			var se *StateError
			if !errors.As(err, &se) {
				t.Errorf("%q + %s: got %v, want a *StateError", from, c, err)
				continue
			}
			if from != "" && !strings.Contains(err.Error(), "desktop is "+string(from)) {
				t.Errorf("%q + %s: message %q does not name the state", from, c, err)
			}
		}
	}
	if checked < 40 {
		t.Fatalf("only %d refused pairs checked", checked)
	}
	_, _, err := Next(Asleep, Sleep)
	if got := err.Error(); got != "desktop is asleep; sleep needs it running" {
		t.Errorf("message %q", got)
	}
}

// TestRulesMatchTheSeed: the rules marked Seed are exactly the seed's rows.
func TestRulesMatchTheSeed(t *testing.T) {
	n := 0
	for _, r := range Rules() {
		if r.Seed {
			n++
		}
	}
	want := 0
	for _, row := range seedRows {
		want += len(row.causes) // one rule per cause, whatever the from states
	}
	if n != want {
		t.Errorf("%d rules marked Seed, the seed's table has %d (cause, from) rows", n, want)
	}
}

func TestStatesTable(t *testing.T) {
	if got := len(States()); got != 6 {
		t.Fatalf("%d states, want 6", got)
	}
	for s, want := range map[State]int{Starting: 0, Running: 0, Stopping: 0, Asleep: 0, Stopped: 409, Failed: 502} {
		if got := s.MCPStatus(); got != want {
			t.Errorf("%s: an MCP call answers %d first, want %d", s, got, want)
		}
		if s.Meaning() == "" || s.Compute() == "" {
			t.Errorf("%s has no meaning", s)
		}
	}
	for _, s := range []State{Asleep, Stopped, Failed} {
		if s.Compute() != "None" {
			t.Errorf("%s computes %q", s, s.Compute())
		}
	}
	var s State
	if err := json.Unmarshal([]byte(`"sleeping"`), &s); err == nil {
		t.Error("unknown state accepted")
	}
}

func TestSizes(t *testing.T) {
	if got := Sizes(); !slices.Equal(got, []Size{"s", "m", "l", "xl"}) {
		t.Fatalf("sizes %v", got)
	}
	if r := Size("m").Resources(); r.VCPU != 2 || r.MemoryMiB != 4096 || r.SizeClass != "m" {
		t.Errorf("m: %+v", r)
	}
	_, err := ParseSize("size", "huge")
	var fe *session.FieldError
	if !errors.As(err, &fe) || fe.Field != "size" || !strings.Contains(fe.Message, "xl") {
		t.Errorf("bad size: %v", err)
	}
}

func TestCreateRequest(t *testing.T) {
	for _, c := range []struct {
		req   CreateRequest
		field string
		size  Size
	}{
		{CreateRequest{Name: "work"}, "", "s"},
		{CreateRequest{Name: "work", Size: "l"}, "", "l"},
		{CreateRequest{}, "name", ""},
		{CreateRequest{Name: "  "}, "name", ""},
		{CreateRequest{Name: strings.Repeat("x", 101)}, "name", ""},
		{CreateRequest{Name: "a\nb"}, "name", ""},
		{CreateRequest{Name: "w", Size: "xxl"}, "size", ""},
	} {
		size, err := c.req.Validate()
		var fe *session.FieldError
		if c.field == "" {
			if err != nil || size != c.size {
				t.Errorf("%+v: %v %v", c.req, size, err)
			}
		} else if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want a field error on %s", c.req, err, c.field)
		}
	}
}

// TestResize is the seed's "Changing the size".
func TestResize(t *testing.T) {
	asleep := Record{Desktop: Desktop{State: Asleep, Size: "s", StateSaved: true}, DiskSnapshot: "snap_d", MemorySnapshot: "snap_m"}
	out, dropped := Resize(asleep, "m")
	if out.Size != "m" || out.NextSize != "" || dropped != "snap_m" || out.MemorySnapshot != "" || out.StateSaved || out.DiskSnapshot != "snap_d" {
		t.Errorf("asleep: %+v dropped %q", out, dropped)
	}
	if out, dropped := Resize(asleep, "s"); dropped != "" || out.MemorySnapshot != "snap_m" {
		t.Errorf("asleep, same size: the state was dropped: %+v", out)
	}
	stopped := Record{Desktop: Desktop{State: Stopped, Size: "s"}, DiskSnapshot: "snap_d"}
	if out, _ := Resize(stopped, "l"); out.Size != "l" || out.NextSize != "" {
		t.Errorf("stopped: %+v", out)
	}
	running := Record{Desktop: Desktop{State: Running, Size: "s"}}
	out, _ = Resize(running, "m")
	if out.Size != "s" || out.NextSize != "m" {
		t.Errorf("running: %+v", out)
	}
	if size, fresh := out.StartSize(); size != "m" || !fresh {
		t.Errorf("running with a resize waiting starts %s fresh=%v", size, fresh)
	}
	if back, _ := Resize(out, "s"); back.NextSize != "" {
		t.Errorf("resize back to the running size keeps %q waiting", back.NextSize)
	}
	if size, fresh := running.StartSize(); size != "s" || fresh {
		t.Errorf("no resize: %s %v", size, fresh)
	}
}

// TestObjectJSON: state_saved appears only for an asleep desktop that saved its state, the
// record's internals never reach the API object.
func TestObjectJSON(t *testing.T) {
	at := session.Time{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	r := Record{Desktop: Desktop{ID: "desk_1", Name: "w", Size: "s", State: Asleep, StateSaved: true,
		MCPURL: "http://x/v1/desktops/desk_1/mcp", CreatedAt: at, UpdatedAt: at, SessionID: "sess_1"},
		DiskSnapshot: "snap_d", MemorySnapshot: "snap_m", Version: 3}
	b, _ := json.Marshal(r.Public())
	got := string(b)
	for _, want := range []string{`"object":"desktop"`, `"state":"asleep"`, `"state_saved":true`, `"mcp_url":"http://x/v1/desktops/desk_1/mcp"`} {
		if !strings.Contains(got, want) {
			t.Errorf("%s lacks %s", got, want)
		}
	}
	for _, no := range []string{"snap_", "sess_1", "version", "goal"} {
		if strings.Contains(got, no) {
			t.Errorf("%s shows %s", got, no)
		}
	}
	r.StateSaved = false
	if b, _ := json.Marshal(r.Public()); strings.Contains(string(b), "state_saved") {
		t.Errorf("state not saved, yet %s", b)
	}
	r.State, r.StateSaved = Running, true
	if b, _ := json.Marshal(r.Public()); strings.Contains(string(b), "state_saved") || !strings.Contains(string(b), "sess_1") {
		t.Errorf("running: %s", b)
	}
	if ev := Events(); len(ev) != 7 || ev[0] != "desktop.starting" || ev[6] != "desktop.deleted" {
		t.Errorf("events %v", ev)
	}
}
