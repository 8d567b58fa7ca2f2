package quota

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/store"
)

// The full sweep forgets a session's settled seq once the replay window has passed since its
// last settled record (a replay within it is still dropped), and the spend hash's hourly
// fields once they are older than any reader needs; the month's and day's spend, and the
// usage report, stay as they were.
func TestSweepPrunesSeqsAndSpendHours(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	const project = "proj_prune"
	if _, err := st.EnsureProject(ctx, project, project); err != nil {
		t.Fatal(err)
	}
	k := store.ProjectKeys(project)
	rs := records(project, []string{"sess_p"}, 5) // of end user eu_0, in t0's hour
	s := NewSettler(rdb, SettlerOptions{Consumer: "c1"})
	settle := func() {
		t.Helper()
		for n, err := s.SettleProject(ctx, project); n > 0 || err != nil; n, err = s.SettleProject(ctx, project) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	appendAll(t, rdb, rs)
	settle()
	type readers struct {
		spend, euSpend int64
		bySession      Report
		byEndUser      Report
	}
	read := func() readers {
		t.Helper()
		var r readers
		var err error
		if r.spend, err = accounts.Spend(ctx, project, "", t0); err != nil {
			t.Fatal(err)
		}
		if r.euSpend, err = accounts.Spend(ctx, project, "eu_0", t0); err != nil {
			t.Fatal(err)
		}
		if r.bySession, err = accounts.Report(ctx, project, t0, t0.Add(time.Hour), "session"); err != nil {
			t.Fatal(err)
		}
		if r.byEndUser, err = accounts.Report(ctx, project, t0, t0.Add(time.Hour), "end_user"); err != nil {
			t.Fatal(err)
		}
		return r
	}
	before := read()
	if before.spend == 0 || before.euSpend == 0 {
		t.Fatalf("nothing billed: %+v", before)
	}
	fields := func() map[string]string {
		t.Helper()
		m, err := rdb.HGetAll(ctx, k.Spend()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	hourly := func(m map[string]string) (out []string) {
		for f := range m {
			if strings.HasPrefix(f, "h:") || strings.Contains(f, ":h:") {
				out = append(out, f)
			}
		}
		return out
	}
	if len(hourly(fields())) != 2 {
		t.Fatalf("spend hash %v: want the project's and eu_0's fields of t0's hour", fields())
	}
	seq := func() string {
		t.Helper()
		v, _ := rdb.HGet(ctx, k.UsageSeq(), "sess_p").Result()
		return v
	}

	// Within the window: t0's hour is days old, past what the hourly fields are kept for, and
	// the session's seq stays, so that a replay is still dropped.
	s.sweep(ctx)
	if h := hourly(fields()); len(h) != 0 {
		t.Errorf("hourly spend fields %v left after the sweep, want none older than %v", h, spendHoursKept)
	}
	for _, f := range []string{"m:" + monthOf(t0), "d:" + t0.Format("20060102"), "eu:eu_0:m:" + monthOf(t0), "eu:eu_0:d:" + t0.Format("20060102")} {
		if _, ok := fields()[f]; !ok {
			t.Errorf("spend field %s pruned", f)
		}
	}
	if seq() != "5" {
		t.Fatalf("sess_p's settled seq is %q within the replay window, want 5", seq())
	}
	appendAll(t, rdb, rs[2:3]) // seq 3 again
	settle()
	if got := read(); !reflect.DeepEqual(got, before) {
		t.Fatalf("after a replay within the window: %+v, want %+v (the replay dropped)", got, before)
	}

	// Past the window: the session is forgotten.
	s.now = func() time.Time { return time.Now().Add(DefaultReplayWindow + time.Minute) }
	s.sweep(ctx)
	if v := seq(); v != "" {
		t.Errorf("sess_p's settled seq %q kept past the replay window", v)
	}
	for _, key := range []string{k.UsageSeqAt(), k.SpendHours()} {
		if n, err := rdb.ZCard(ctx, key).Result(); err != nil || n != 0 {
			t.Errorf("index %s holds %d entries (%v), want none", key, n, err)
		}
	}
	if got := read(); !reflect.DeepEqual(got, before) {
		t.Fatalf("readers after the prune: %+v, want %+v", got, before)
	}
}
