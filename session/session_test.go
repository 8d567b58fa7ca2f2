package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

// The seed's "States" table: state and its Billed column.
func TestStatesTable(t *testing.T) {
	want := []struct {
		state    State
		billing  Billing
		terminal bool
		secs     bool
	}{
		{Pending, BilledNo, false, false},
		{Provisioning, BilledNo, false, false},
		{Running, BilledYes, false, true},
		{Paused, BilledStorageOnly, false, false},
		{Snapshotting, BilledYes, false, true},
		{Stopping, BilledUntilMeter, false, true},
		{Stopped, BilledNo, true, false},
		{Failed, BilledNo, true, false},
		{Expired, BilledNo, true, false},
	}
	if len(States()) != len(want) {
		t.Fatalf("States() has %d states, seed has %d", len(States()), len(want))
	}
	for i, w := range want {
		s := States()[i]
		if s != w.state || s.Billing() != w.billing || s.Terminal() != w.terminal || s.BillsSessionSeconds() != w.secs {
			t.Errorf("%s: billing %s terminal %v secs %v; want %+v", s, s.Billing(), s.Terminal(), s.BillsSessionSeconds(), w)
		}
		if s.Meaning() == "" {
			t.Errorf("%s has no meaning", s)
		}
	}
}

type row struct {
	from, to State
	driver   Driver
	reason   Reason
}

// expectedTransitions is written out independently of the rules table: the seed's rows, one
// line per (from, to, driver, reason), then the documented additions.
func expectedTransitions() []row {
	rows := []row{
		{"", Pending, APIGateway, ""},
		{Pending, Provisioning, Placer, ""},
		{Provisioning, Running, Node, ""},
		{Provisioning, Failed, Node, StartFailure},
		{Provisioning, Failed, Node, OOM},
		{Provisioning, Failed, Timer, ProvisionTimeout},
		{Running, Paused, Caller, ""},
		{Paused, Running, Caller, ""},
		{Running, Snapshotting, Caller, ""},
		{Snapshotting, Running, Caller, ""},
		{Running, Stopping, Caller, Deleted},
		{Running, Stopping, Timer, IdleTimeout},
		{Running, Stopping, Timer, MaxLifetime},
		{Running, Stopping, Placer, Eviction},
		{Running, Stopping, Policy, PolicyViolation},
		{Running, Stopping, Metering, SpendCap},
		{Stopping, Stopped, Node, Deleted},
		{Stopping, Stopped, Node, IdleTimeout},
		{Stopping, Stopped, Node, SpendCap},
		{Stopping, Stopped, Node, Eviction},
		{Stopping, Failed, Node, PolicyViolation},
		// additions
		{Stopping, Expired, Node, MaxLifetime},
		{Running, Failed, Node, OOM},
		{Running, Failed, Node, GuestCrash},
		{Pending, Failed, Timer, ProvisionTimeout},
		{Pending, Stopped, Caller, Deleted},
		{Provisioning, Stopping, Caller, Deleted},
		{Paused, Stopping, Caller, Deleted},
		{Paused, Stopping, Timer, IdleTimeout},
		{Paused, Stopping, Timer, MaxLifetime},
		{Paused, Stopping, Placer, Eviction},
		{Paused, Stopping, Metering, SpendCap},
		{Paused, Stopping, Policy, PolicyViolation},
		{Pending, Stopped, Metering, SpendCap},
		{Provisioning, Stopping, Metering, SpendCap},
	}
	for _, from := range []State{Provisioning, Running, Paused, Snapshotting, Stopping} {
		rows = append(rows, row{from, Failed, Placer, HostFailure})
	}
	return rows
}

func TestTransitionTableRows(t *testing.T) {
	for _, r := range expectedTransitions() {
		t.Run(fmt.Sprintf("%s→%s/%s/%s", r.from, r.to, r.driver, r.reason), func(t *testing.T) {
			if err := Check(r.from, r.to, r.driver, r.reason); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every combination not in the table must be refused.
func TestNoTransitionOutsideTable(t *testing.T) {
	allowed := map[row]bool{}
	for _, r := range expectedTransitions() {
		allowed[r] = true
	}
	froms := append([]State{""}, States()...)
	reasons := append([]Reason{""}, Reasons()...)
	n := 0
	for _, from := range froms {
		for _, to := range States() {
			for _, d := range Drivers() {
				for _, reason := range reasons {
					r := row{from, to, d, reason}
					err := Check(from, to, d, reason)
					if allowed[r] != (err == nil) {
						t.Errorf("%+v: allowed=%v, Check=%v", r, allowed[r], err)
					}
					if err != nil {
						var te *TransitionError
						if !errors.As(err, &te) {
							t.Errorf("%+v: error %T, want *TransitionError", r, err)
						}
					}
					n++
				}
			}
		}
	}
	if n != 10*9*7*12 {
		t.Fatalf("checked %d combinations", n)
	}
	// Every rule row is in the expected list, so the table holds nothing unexplained.
	for _, r := range Rules() {
		if r.Note == "" {
			t.Errorf("rule %s→%s by %s has no note", r.From, r.To, r.Driver)
		}
		reasons := r.Reasons
		if len(reasons) == 0 {
			reasons = []Reason{""}
		}
		for _, reason := range reasons {
			if !allowed[row{r.From, r.To, r.Driver, reason}] {
				t.Errorf("rule %s→%s by %s (%s) not expected", r.From, r.To, r.Driver, reason)
			}
		}
	}
}

// One driver per (from, to, reason).
func TestOneDriverPerTransition(t *testing.T) {
	seen := map[[3]string]Driver{}
	for _, r := range Rules() {
		reasons := r.Reasons
		if len(reasons) == 0 {
			reasons = []Reason{""}
		}
		for _, reason := range reasons {
			k := [3]string{string(r.From), string(r.To), string(reason)}
			if d, ok := seen[k]; ok {
				t.Errorf("%v has two drivers: %s and %s", k, d, r.Driver)
			}
			seen[k] = r.Driver
		}
	}
}

func TestWrongDriverNamesTheRightOne(t *testing.T) {
	err := Check(Pending, Provisioning, Caller, "")
	var te *TransitionError
	if !errors.As(err, &te) || te.Message != "only placer may make it" {
		t.Fatalf("got %v", err)
	}
	err = Check(Running, Stopping, Timer, Deleted)
	if !errors.As(err, &te) || te.Driver != Timer {
		t.Fatalf("got %v", err)
	}
	if err := Check(Running, Stopping, Caller, ""); err == nil {
		t.Fatal("stop without reason allowed")
	}
	if err := Check(Running, Paused, Caller, Deleted); err == nil {
		t.Fatal("pause with a reason allowed")
	}
}

func TestUnknownNamesAreFieldErrors(t *testing.T) {
	cases := []struct {
		err   error
		field string
	}{
		{Check("bogus", Running, Node, ""), "from"},
		{Check(Pending, "bogus", Node, ""), "to"},
		{Check(Pending, Provisioning, "bogus", ""), "driver"},
		{Check(Running, Stopping, Caller, "bogus"), "reason"},
	}
	for _, c := range cases {
		var fe *FieldError
		if !errors.As(c.err, &fe) || fe.Field != c.field {
			t.Errorf("got %v, want a FieldError on %s", c.err, c.field)
		}
	}
	if _, err := ParseState("state", "runnin"); err == nil {
		t.Error("ParseState accepted runnin")
	}
	if _, err := ParseReason("state_reason", "bored"); err == nil {
		t.Error("ParseReason accepted bored")
	}
	var s State
	if err := json.Unmarshal([]byte(`"nope"`), &s); err == nil {
		t.Error("State JSON accepted nope")
	}
	var r Reason
	if err := json.Unmarshal([]byte(`"nope"`), &r); err == nil {
		t.Error("Reason JSON accepted nope")
	}
}

// Issue: the terminal state each reason leads to; and the seed's failure table.
func TestReasonTerminal(t *testing.T) {
	want := map[Reason]State{
		MaxLifetime: Expired,
		HostFailure: Failed, OOM: Failed, PolicyViolation: Failed, StartFailure: Failed, ProvisionTimeout: Failed, GuestCrash: Failed,
		Deleted: Stopped, IdleTimeout: Stopped, SpendCap: Stopped, Eviction: Stopped,
	}
	if len(Reasons()) != len(want) {
		t.Fatalf("%d reasons, want %d", len(Reasons()), len(want))
	}
	for r, s := range want {
		if r.Terminal() != s {
			t.Errorf("%s → %s, want %s", r, r.Terminal(), s)
		}
	}
	// Every rule that ends in a terminal state gives only reasons that lead there.
	for _, rule := range Rules() {
		if !rule.To.Terminal() {
			continue
		}
		for _, r := range rule.Reasons {
			if r.Terminal() != rule.To {
				t.Errorf("rule %s→%s gives %s, which leads to %s", rule.From, rule.To, r, r.Terminal())
			}
		}
	}
}

// The seed's "Failure semantics" table: the path each failure takes from running.
func TestFailureSemantics(t *testing.T) {
	cases := []struct {
		failure string
		from    State
		driver  Driver
		reason  Reason
		path    []State
		event   string
	}{
		{"cold start exceeded the deadline", Provisioning, Timer, ProvisionTimeout, []State{Failed}, EventFailed},
		{"host died while running", Running, Placer, HostFailure, []State{Failed}, EventFailed},
		{"guest OOM", Running, Node, OOM, []State{Failed}, EventFailed},
		{"guest crashed by its own doing", Running, Node, GuestCrash, []State{Failed}, EventFailed},
		{"policy violation", Running, Policy, PolicyViolation, []State{Stopping, Failed}, EventFailed},
		{"spend cap breached", Running, Metering, SpendCap, []State{Stopping, Stopped}, EventStopped},
		{"maximum lifetime reached", Running, Timer, MaxLifetime, []State{Stopping, Expired}, EventExpired},
		{"delete", Running, Caller, Deleted, []State{Stopping, Stopped}, EventStopped},
		{"idle timeout", Running, Timer, IdleTimeout, []State{Stopping, Stopped}, EventStopped},
	}
	for _, c := range cases {
		t.Run(c.failure, func(t *testing.T) {
			next, err := Next(c.from, c.driver, c.reason)
			if err != nil {
				t.Fatal(err)
			}
			path := []State{next}
			if next == Stopping {
				if err := Check(Stopping, c.reason.Terminal(), Node, c.reason); err != nil {
					t.Fatal(err)
				}
				path = append(path, c.reason.Terminal())
			}
			if !slices.Equal(path, c.path) {
				t.Fatalf("path %v, want %v", path, c.path)
			}
			last := path[len(path)-1]
			if ev := EventType(path[max(0, len(path)-2)], last); ev != c.event {
				t.Fatalf("event %s, want %s", ev, c.event)
			}
			if last.Billing() != BilledNo {
				t.Fatalf("terminal %s bills", last)
			}
		})
	}
	// Client disconnected: unchanged; there is no transition without a driver's action to test
	// beyond that nothing in the table is driven by a connection.
	if _, err := Next(Stopped, Caller, Deleted); err == nil {
		t.Fatal("a stopped session can be stopped again")
	}
}

func TestEventTypes(t *testing.T) {
	cases := map[[2]State]string{
		{"", Pending}:           EventPending,
		{Provisioning, Running}: EventRunning,
		{Paused, Running}:       EventResumed,
		{Snapshotting, Running}: EventSnapshotted,
		{Running, Paused}:       EventPaused,
		{Running, Stopping}:     EventStopping,
		{Stopping, Stopped}:     EventStopped,
		{Stopping, Failed}:      EventFailed,
		{Stopping, Expired}:     EventExpired,
		{Pending, Provisioning}: EventProvisioning,
		{Running, Snapshotting}: EventSnapshotting,
	}
	for k, v := range cases {
		if got := EventType(k[0], k[1]); got != v {
			t.Errorf("%v: %s, want %s", k, got, v)
		}
	}
	for _, internal := range []string{EventProvisioning, EventSnapshotting, EventSnapshotted} {
		if slices.Contains(PublicEvents(), internal) {
			t.Errorf("%s is public", internal)
		}
	}
	if len(PublicEvents()) != 13 {
		t.Errorf("%d public events, the API's WebhookEventType lists 13", len(PublicEvents()))
	}
}

// The seed's "Timeouts" table and the tier rules.
func TestTimeoutsTable(t *testing.T) {
	tiers := DefaultTiers()
	one := 1
	st, err := (&CreateRequest{Tier: &one}).Validate(tiers)
	if err != nil {
		t.Fatal(err)
	}
	if st.IdleTimeoutS != 300 || st.MaxLifetimeS != 3600 {
		t.Fatalf("defaults %d/%d, want 300/3600", st.IdleTimeoutS, st.MaxLifetimeS)
	}
	four, _ := tiers.Tier(4)
	cases := []struct {
		tier       Tier
		idle, life int
		field      string
	}{
		{four, 30, 60, ""},
		{four, 7200, 86400, ""},
		{four, 29, 3600, "idle_timeout_s"},
		{four, 7201, 3600, "idle_timeout_s"},
		{four, -1, 3600, "idle_timeout_s"},
		{four, 300, 59, "max_lifetime_s"},
		{four, 300, 86401, "max_lifetime_s"},
		{tiers[0], 300, 3601, "max_lifetime_s"}, // tier 1 ceiling
		{tiers[1], 300, 21600, ""},
		{tiers[1], 300, 21601, "max_lifetime_s"},
	}
	for _, c := range cases {
		err := c.tier.ValidateTimeouts(c.idle, c.life)
		var fe *FieldError
		if c.field == "" && err != nil || c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field) {
			t.Errorf("tier %d idle %d life %d: %v, want field %q", c.tier.Number, c.idle, c.life, err, c.field)
		}
	}
	for _, ti := range tiers {
		if ti.CanPause != (ti.Number >= 2) {
			t.Errorf("tier %d CanPause=%v", ti.Number, ti.CanPause)
		}
		if ti.MaxLifetimeS > LifetimeMaxS || ti.MaxLifetimeS < LifetimeDefaultS {
			t.Errorf("tier %d ceiling %d", ti.Number, ti.MaxLifetimeS)
		}
		if ti.ProvisionDeadline() != 3*ti.ColdP95 {
			t.Errorf("tier %d deadline %s", ti.Number, ti.ProvisionDeadline())
		}
	}
	if PauseMax != time.Hour {
		t.Errorf("pause max %s", PauseMax)
	}
	custom := DefaultTiers()
	custom[1].ColdP95 = 7 * time.Second
	if custom[1].ProvisionDeadline() != 21*time.Second || DefaultTiers()[1].ProvisionDeadline() == 21*time.Second {
		t.Error("per-tier cold p95 is not configurable per value")
	}
	if _, err := tiers.Tier(5); err == nil {
		t.Error("tier 5 accepted")
	}
}

func TestCreateValidation(t *testing.T) {
	tiers := DefaultTiers()
	i := func(v int) *int { return &v }
	cases := []struct {
		req   CreateRequest
		field string
	}{
		{CreateRequest{}, "tier"},
		{CreateRequest{Tier: i(0)}, "tier"},
		{CreateRequest{Tier: i(5)}, "tier"},
		{CreateRequest{Tier: i(2), IdleTimeoutS: i(10)}, "idle_timeout_s"},
		{CreateRequest{Tier: i(2), MaxLifetimeS: i(1 << 40)}, "max_lifetime_s"},
		{CreateRequest{Tier: i(1), Resources: &ResourceRequest{SizeClass: "xl"}}, "resources.size_class"},
		{CreateRequest{Tier: i(1), Resources: &ResourceRequest{SizeClass: "s", VCPU: i(1)}}, "resources"},
		{CreateRequest{Tier: i(2), Resources: &ResourceRequest{VCPU: i(-1)}}, "resources.vcpu"},
		{CreateRequest{Tier: i(2), Resources: &ResourceRequest{MemoryMiB: i(1 << 30)}}, "resources.memory_mib"},
		{CreateRequest{Tier: i(2), Resources: &ResourceRequest{DiskGiB: i(0)}}, "resources.disk_gib"},
		{CreateRequest{Tier: i(2), Metadata: map[string]string{"": "x"}}, "metadata"},
		{CreateRequest{Tier: i(2), EndUserID: string(make([]byte, 200))}, "end_user_id"},
	}
	for _, c := range cases {
		_, err := c.req.Validate(tiers)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want field %s", c.req, err, c.field)
		}
	}
	st, err := (&CreateRequest{Tier: i(2), Resources: &ResourceRequest{MemoryMiB: i(3000)}}).Validate(tiers)
	if err != nil || st.Resources != (Resources{1, 3000, 10, "m"}) {
		t.Fatalf("%+v %v", st.Resources, err)
	}
	st, err = (&CreateRequest{Tier: i(3), Resources: &ResourceRequest{SizeClass: "m"}}).Validate(tiers)
	if err != nil || st.Resources != (Resources{2, 4096, 20, "m"}) {
		t.Fatalf("%+v %v", st.Resources, err)
	}
}

func TestApplyPatch(t *testing.T) {
	start := time.Date(2026, 10, 6, 9, 14, 22, 118e6, time.UTC)
	s := Session{Tier: 2, IdleTimeoutS: 300, MaxLifetimeS: 3600, StartedAt: At(start)}
	i := func(v int) *int { return &v }
	got, err := ApplyPatch(DefaultTiers(), s, PatchRequest{MaxLifetimeS: i(7200)}, start.Add(time.Hour))
	if err != nil || !got.ExpiresAt.Equal(start.Add(2*time.Hour)) || got.MaxLifetimeS != 7200 {
		t.Fatalf("%v %v", got.ExpiresAt, err)
	}
	if _, err := ApplyPatch(DefaultTiers(), s, PatchRequest{MaxLifetimeS: i(600)}, start.Add(time.Hour)); err == nil {
		t.Fatal("a lifetime already past was accepted")
	}
	if _, err := ApplyPatch(DefaultTiers(), s, PatchRequest{IdleTimeoutS: i(7201)}, start); err == nil {
		t.Fatal("idle 7201 accepted")
	}
	if _, err := ApplyPatch(DefaultTiers(), s, PatchRequest{}, start); err == nil {
		t.Fatal("empty patch accepted")
	}
}

func TestTimers(t *testing.T) {
	start := time.Date(2026, 10, 6, 9, 0, 0, 0, time.UTC)
	s := Session{IdleTimeoutS: 300, MaxLifetimeS: 3600, StartedAt: At(start)}
	if !s.IdleDeadline().Equal(start.Add(300*time.Second)) || !s.IdleWarning().Equal(start.Add(240*time.Second)) {
		t.Fatalf("idle %s warn %s", s.IdleDeadline(), s.IdleWarning())
	}
	s.LastActivityAt = At(start.Add(time.Minute))
	if !s.IdleDeadline().Equal(start.Add(360 * time.Second)) {
		t.Fatalf("activity did not reset idle: %s", s.IdleDeadline())
	}
	if !s.LifetimeWarning().Equal(start.Add(3240*time.Second)) || !s.Expiry().Equal(start.Add(time.Hour)) {
		t.Fatalf("lifetime warn %s expiry %s", s.LifetimeWarning(), s.Expiry())
	}
}

// The seed's session object, verbatim but for the elided digest.
const seedExample = `{
"id": "sess_2kQ9xwR4",
"object": "session",
"tier": 2,
"state": "running",
"project_id": "proj_7fTn21",
"end_user_id": "eu_customer_4821",
"template": "tpl_dev_polyglot@sha256:9f3c",
"region": "bom1",
"zone": "bom1-b",
"resources": { "vcpu": 2, "memory_mib": 4096, "disk_gib": 20, "size_class": "m" },
"volume_id": null,
"policy_id": "pol_build_tools@7",
"idle_timeout_s": 300,
"max_lifetime_s": 3600,
"started_at": "2026-10-06T09:14:22.118Z",
"expires_at": "2026-10-06T10:14:22.118Z",
"last_activity_at": "2026-10-06T09:21:04.882Z",
"cold_start": false,
"connect": {
"exec_url": "https://api.workspaces.build/v1/sessions/sess_2kQ9xwR4/exec",
"pty_url": "wss://connect.workspaces.build/v1/sessions/sess_2kQ9xwR4/pty"
},
"usage_to_date": {
"session_s": 402,
"cpu_ms": 118430,
"mem_gib_ms": 1646592,
"egress_bytes": 33294112
}
}`

func TestSessionJSONMatchesSeed(t *testing.T) {
	var s Session
	dec := json.NewDecoder(bytes.NewReader([]byte(seedExample)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	var want, got map[string]any
	_ = json.Unmarshal([]byte(seedExample), &want)
	_ = json.Unmarshal(out, &got)
	additions := map[string]any{"state_reason": nil, "rule": nil, "idle_warning_at": nil,
		"lifetime_warning_at": nil, "paused_at": nil, "stopped_at": nil, "restore_from": nil,
		"created_at": "0001-01-01T00:00:00.000Z", "metadata": nil}
	for k, v := range additions {
		if gv, ok := got[k]; !ok || !reflect.DeepEqual(gv, v) {
			t.Errorf("addition %s = %v (present %v), want %v", k, gv, ok, v)
		}
		delete(got, k)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip differs:\n got %v\nwant %v", got, want)
	}
	// Seed order: the first keys of the output are the seed's, in order.
	keys := jsonKeys(t, out)
	wantKeys := jsonKeys(t, []byte(seedExample))
	if !slices.Equal(keys[:len(wantKeys)], wantKeys) {
		t.Fatalf("key order %v, want %v", keys[:len(wantKeys)], wantKeys)
	}
	// A fresh pending session: nullable fields are null, never missing.
	var empty map[string]any
	out, _ = json.Marshal(&Session{State: Pending})
	_ = json.Unmarshal(out, &empty)
	for _, k := range []string{"end_user_id", "zone", "volume_id", "policy_id", "started_at", "expires_at", "last_activity_at", "cold_start"} {
		if v, ok := empty[k]; !ok || v != nil {
			t.Errorf("%s = %v (present %v), want null", k, v, ok)
		}
	}
}

func jsonKeys(t *testing.T, b []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(b))
	var keys []string
	depth := 0
	expectKey := false
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' || v == '[' {
				depth++
			} else {
				depth--
			}
			expectKey = depth == 1
			continue
		case string:
			if depth == 1 && expectKey {
				keys = append(keys, v)
				expectKey = false
				continue
			}
		}
		if depth == 1 {
			expectKey = true
		}
	}
	return keys
}

func TestTimeFormat(t *testing.T) {
	b, _ := json.Marshal(At(time.Date(2026, 10, 6, 9, 14, 22, 118_400_000, time.FixedZone("x", 3600))))
	if string(b) != `"2026-10-06T08:14:22.118Z"` {
		t.Fatal(string(b))
	}
}

func TestNewIDSortsByTime(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := ""
	for i := 0; i < 1000; i++ {
		id := NewID("sess_", t0.Add(time.Duration(i)*time.Millisecond))
		if len(id) != len("sess_")+18 || id <= prev {
			t.Fatalf("%q after %q", id, prev)
		}
		prev = id
	}
}
