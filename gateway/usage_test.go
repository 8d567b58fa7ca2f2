package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"wb/quota"
	"wb/session"
	"wb/store"
)

func TestLimitsAndSpendCap(t *testing.T) {
	e := newEnv(t)
	var l Limits
	e.mustDo("GET", "/v1/limits", e.key, nil, 200, &l)
	if l.MonthlySpendCapMicroUSD != 0 || l.Concurrency != 100 {
		t.Fatalf("defaults %+v", l)
	}
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"monthly_spend_cap_micro_usd": 1000, "concurrency": 5}, 200, &l)
	if l.MonthlySpendCapMicroUSD != 1000 || l.Concurrency != 5 || l.EndUserMonthlySpendCapMicroUSD != 0 {
		t.Fatalf("put %+v", l)
	}
	expectError(t, e.do("PUT", "/v1/limits", e.key, map[string]any{"monthly_spend_cap_micro_usd": -1}), 400, "invalid_request", "monthly_spend_cap_micro_usd")
	expectError(t, e.do("PUT", "/v1/limits", e.key, map[string]any{"concurrency": -1}), 400, "invalid_request", "concurrency")
	expectError(t, e.do("PUT", "/v1/limits", e.key, map[string]any{"cap": 1}), 400, "invalid_request", "cap")

	// Settle enough usage to cross the cap: the hard cap stops admissions with 402.
	ctx := context.Background()
	now := time.Now()
	rec := quota.Record{SessionID: "sess_x", ProjectID: e.projA, Tier: 2, SizeClass: "s", Seq: 1,
		FromMs: now.Add(-time.Minute).UnixMilli(), ToMs: now.UnixMilli(), State: session.Running, SessionMs: 60_000}
	if err := e.st.AppendUsage(ctx, e.projA, rec.Values()); err != nil {
		t.Fatal(err)
	}
	var fired []quota.CapEvent
	s := quota.NewSettler(e.rdb, quota.SettlerOptions{Caps: quota.NewCaps(e.rdb, func(_ context.Context, ev quota.CapEvent) { fired = append(fired, ev) }, nil)})
	if _, err := s.SettleProject(ctx, e.projA); err != nil {
		t.Fatal(err)
	}
	if len(fired) != 1 || fired[0].Level != "hard" || fired[0].SpendMicroUSD != 60*28 {
		t.Fatalf("cap events %+v", fired)
	}
	msg := expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2}), 402, "spend_cap_reached", "")
	if !strings.Contains(msg, "PUT /v1/limits") {
		t.Fatalf("402 does not say what to do: %s", msg)
	}
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "python3", "code": "1"}), 402, "spend_cap_reached", "")
	// Raising the cap above the spend lifts the stop.
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"monthly_spend_cap_micro_usd": 10_000_000}, 200, &l)
	if l.SpendThisMonthMicroUSD != 60*28 {
		t.Fatalf("spend %d", l.SpendThisMonthMicroUSD)
	}
	e.create(e.key, map[string]any{"tier": 2, "region": "far"})

	var rep quota.Report
	e.mustDo("GET", "/v1/usage?group_by=session", e.key, nil, 200, &rep)
	if len(rep.Data) != 1 || rep.Data[0].SessionID != "sess_x" || rep.Data[0].SessionS != 60 || rep.Totals.CostMicro != 60*28 {
		t.Fatalf("usage %+v", rep)
	}
	from := now.Add(-2 * time.Hour).UTC().Format(time.RFC3339)
	e.mustDo("GET", "/v1/usage?group_by=end_user&from="+from, e.key, nil, 200, &rep)
	if len(rep.Data) != 1 || rep.Data[0].EndUserID != "" || rep.GroupBy != "end_user" {
		t.Fatalf("by end user %+v", rep)
	}
	expectError(t, e.do("GET", "/v1/usage?group_by=tier", e.key, nil), 400, "invalid_request", "group_by")
	expectError(t, e.do("GET", "/v1/usage?from=yesterday", e.key, nil), 400, "invalid_request", "from")
	// Another project sees none of it.
	_, keyB := e.newProject("B", nil)
	e.mustDo("GET", "/v1/usage", keyB, nil, 200, &rep)
	if len(rep.Data) != 0 || rep.Totals.SessionS != 0 {
		t.Fatalf("B sees A's usage: %+v", rep)
	}
}

// Raising the end-user cap above an end user's spend admits them again (the way out of a
// spend-cap stop is to raise the cap); an end user still over the raised cap stays stopped.
func TestRaisedEndUserCapAdmitsAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"end_user_monthly_spend_cap_micro_usd": 100}, 200, nil)
	// 28 µUSD per second: eu_low spends 280, eu_high 2,800; both cross the cap of 100.
	now := time.Now()
	for i, u := range []struct {
		endUser string
		ms      int64
	}{{"eu_low", 10_000}, {"eu_high", 100_000}} {
		rec := quota.Record{SessionID: fmt.Sprintf("sess_%d", i), ProjectID: e.projA, EndUserID: u.endUser, Tier: 2, SizeClass: "s", Seq: 1,
			FromMs: now.Add(-time.Minute).UnixMilli(), ToMs: now.UnixMilli(), State: session.Running, SessionMs: u.ms}
		if err := e.st.AppendUsage(ctx, e.projA, rec.Values()); err != nil {
			t.Fatal(err)
		}
	}
	s := quota.NewSettler(e.rdb, quota.SettlerOptions{Caps: quota.NewCaps(e.rdb, nil, nil)})
	if _, err := s.SettleProject(ctx, e.projA); err != nil {
		t.Fatal(err)
	}
	for _, eu := range []string{"eu_low", "eu_high"} {
		expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "end_user_id": eu}), 402, "spend_cap_reached", "")
	}
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"end_user_monthly_spend_cap_micro_usd": 1000}, 200, nil)
	e.create(e.key, map[string]any{"tier": 2, "end_user_id": "eu_low"})
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "end_user_id": "eu_high"}), 402, "spend_cap_reached", "")
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"end_user_monthly_spend_cap_micro_usd": 1_000_000}, 200, nil)
	e.create(e.key, map[string]any{"tier": 2, "end_user_id": "eu_high"})
}

// Past a hard cap, :resume answers 402 in the cap's scope as a create does: a session
// resumed while the cap's stop went on ran past the cap. Raising the cap lets it resume.
func TestResumeRefusedPastTheHardCap(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ids := map[string]string{}
	for _, eu := range []string{"eu_over", "eu_under"} {
		s := e.running(map[string]any{"tier": 2, "end_user_id": eu})
		e.mustDo("POST", "/v1/sessions/"+s.ID+":pause", e.key, nil, 200, nil)
		ids[eu] = s.ID
	}
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"end_user_monthly_spend_cap_micro_usd": 100}, 200, nil)
	now := time.Now()
	rec := quota.Record{SessionID: "sess_spent", ProjectID: e.projA, EndUserID: "eu_over", Tier: 2, SizeClass: "s", Seq: 1,
		FromMs: now.Add(-time.Minute).UnixMilli(), ToMs: now.UnixMilli(), State: session.Running, SessionMs: 60_000}
	if err := e.st.AppendUsage(ctx, e.projA, rec.Values()); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.NewSettler(e.rdb, quota.SettlerOptions{Caps: quota.NewCaps(e.rdb, nil, nil)}).SettleProject(ctx, e.projA); err != nil {
		t.Fatal(err)
	}
	msg := expectError(t, e.do("POST", "/v1/sessions/"+ids["eu_over"]+":resume", e.key, nil), 402, "spend_cap_reached", "")
	if !strings.Contains(msg, "PUT /v1/limits") {
		t.Fatalf("402 does not say what to do: %s", msg)
	}
	e.mustDo("POST", "/v1/sessions/"+ids["eu_under"]+":resume", e.key, nil, 200, nil)
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"end_user_monthly_spend_cap_micro_usd": 1_000_000}, 200, nil)
	e.mustDo("POST", "/v1/sessions/"+ids["eu_over"]+":resume", e.key, nil, 200, nil)
}

// TestUsageStalledCallerIsCut: a usage report (a line a session of its range, of up to 93
// days: here 100,000 sessions' lines, some 13 MB of JSON) whose caller stays connected but
// takes none of it ends once a write to it waited WriteStall, which lets go of the handler
// and the report's megabytes (the call is counted in /metrics as it ends). Before, such a
// caller (asking for a few on one connection) held both for as long as it stayed.
func TestUsageStalledCallerIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	ctx := context.Background()
	key := store.ProjectKeys(e.projA).UsageHour(time.Now())
	for i := range 100 {
		fields := make([]any, 0, 2000)
		for j := range 1000 {
			fields = append(fields, fmt.Sprintf("s:sess_%05d%03d:session_ms", i, j), 1000)
		}
		if err := e.rdb.HSet(ctx, key, fields...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	stalledRead(t, e.srv.Listener.Addr().String(), e.key, "/v1/usage", 3)
	e.waitCounted("GET /v1/usage", 200, 1, "a usage report")
}
