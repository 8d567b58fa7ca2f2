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
	// What a settler before the indexes left: a session's seq and hourly spend fields.
	if err := rdb.HSet(ctx, k.UsageSeq(), "sess_old", 3).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, k.Spend(), "h:2026112909", 7000, "eu:eu_9:h:2026112909", 7000, "eu:eu_9:m:202611", 7000).Err(); err != nil {
		t.Fatal(err)
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
	if len(hourly(fields())) != 4 {
		t.Fatalf("spend hash %v: want the project's and eu_0's fields of t0's hour, and the two older ones", fields())
	}
	seqOf := func(id string) string {
		t.Helper()
		v, _ := rdb.HGet(ctx, k.UsageSeq(), id).Result()
		return v
	}
	seq := func() string { return seqOf("sess_p") }

	// Within the window: t0's hour is days old, past what the hourly fields are kept for, and
	// the session's seq stays, so that a replay is still dropped.
	s.sweep(ctx)
	if h := hourly(fields()); len(h) != 0 {
		t.Errorf("hourly spend fields %v left after the sweep, want none older than %v", h, spendHoursKept)
	}
	for _, f := range []string{"eu:eu_9:m:202611", "m:" + monthOf(t0), "d:" + t0.Format("20060102"), "eu:eu_0:m:" + monthOf(t0), "eu:eu_0:d:" + t0.Format("20060102")} {
		if _, ok := fields()[f]; !ok {
			t.Errorf("spend field %s pruned", f)
		}
	}
	if seq() != "5" || seqOf("sess_old") != "3" {
		t.Fatalf("sess_p's and sess_old's settled seqs are %q and %q within the replay window, want 5 and 3", seq(), seqOf("sess_old"))
	}
	appendAll(t, rdb, rs[2:3]) // seq 3 again
	settle()
	if got := read(); !reflect.DeepEqual(got, before) {
		t.Fatalf("after a replay within the window: %+v, want %+v (the replay dropped)", got, before)
	}

	// Past the window: the session is forgotten.
	s.now = func() time.Time { return time.Now().Add(DefaultReplayWindow + time.Minute) }
	s.sweep(ctx)
	for _, id := range []string{"sess_p", "sess_old"} {
		if v := seqOf(id); v != "" {
			t.Errorf("%s's settled seq %q kept past the replay window", id, v)
		}
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

// hourOfSpendField knows the hourly fields of the spend hash from the others, whatever the
// end user's id.
func TestHourOfSpendField(t *testing.T) {
	hour := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC).UnixMilli()
	for f, want := range map[string]bool{
		"h:2026113010": true, "eu:eu_1:h:2026113010": true, "eu:a:h:b:h:2026113010": true,
		"m:202611": false, "d:20261130": false, "eu:eu_1:m:202611": false, "eu:eu_1:d:20261130": false,
		"eu:x:h:2026113010:d:20261130": false, "h:20261130": false, "eu:h:2026113010": false, "h:20261130xx": false,
	} {
		ms, ok := hourOfSpendField(f)
		if ok != want || (ok && ms != hour) {
			t.Errorf("%s: %d %v, want hourly %v", f, ms, ok, want)
		}
	}
}

// The full sweep drops the spend hash's daily fields once they are older than a usage report
// can span (no code reads them; an operator may compare a report with them), the project's
// and each end user's, those written before they were indexed included; the month's stay.
// They were never dropped: a field a day per end user, for ever.
func TestSweepPrunesSpendDays(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	const project = "proj_days"
	if _, err := st.EnsureProject(ctx, project, project); err != nil {
		t.Fatal(err)
	}
	k := store.ProjectKeys(project)
	// What settlers before the daily index left: a day of spend long ago, and the project's
	// older entries indexed (the flag of the hourly index).
	if err := rdb.HSet(ctx, k.Spend(), "d:20260101", 7000, "eu:eu_9:d:20260101", 7000, "m:202601", 7000, "eu:eu_9:m:202601", 7000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, k.Indexed(), "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := NewSettler(rdb, SettlerOptions{Consumer: "c1"})
	appendAll(t, rdb, records(project, []string{"sess_d"}, 5)) // of end user eu_0, on t0's day
	for n, err := s.SettleProject(ctx, project); n > 0 || err != nil; n, err = s.SettleProject(ctx, project) {
		if err != nil {
			t.Fatal(err)
		}
	}
	fields := func() map[string]string {
		t.Helper()
		m, err := rdb.HGetAll(ctx, k.Spend()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	day := t0.Format("20060102")
	check := func(when string, kept, dropped []string) {
		t.Helper()
		m := fields()
		for _, f := range kept {
			if _, ok := m[f]; !ok {
				t.Errorf("%s: spend field %s pruned, want it kept", when, f)
			}
		}
		for _, f := range dropped {
			if _, ok := m[f]; ok {
				t.Errorf("%s: spend field %s kept, want it pruned", when, f)
			}
		}
	}
	months := []string{"m:202601", "eu:eu_9:m:202601", "m:" + monthOf(t0), "eu:eu_0:m:" + monthOf(t0)}
	s.now = func() time.Time { return t0.Add(10 * 24 * time.Hour) }
	s.sweep(ctx)
	check("10 days after", append([]string{"d:" + day, "eu:eu_0:d:" + day}, months...), []string{"d:20260101", "eu:eu_9:d:20260101"})
	s.now = func() time.Time { return t0.Add(94 * 24 * time.Hour) }
	s.sweep(ctx)
	check("94 days after", months, []string{"d:" + day, "eu:eu_0:d:" + day})
}

// dayOfSpendField knows the daily fields of the spend hash from the others.
func TestDayOfSpendField(t *testing.T) {
	day := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC).UnixMilli()
	for f, want := range map[string]bool{
		"d:20261130": true, "eu:eu_1:d:20261130": true, "eu:a:d:b:d:20261130": true,
		"m:202611": false, "h:2026113010": false, "eu:eu_1:h:2026113010": false, "eu:h:20261130": false,
		"d:2026113010": false, "eu:d:20261130": false, "d:2026113x": false,
	} {
		ms, ok := dayOfSpendField(f)
		if ok != want || (ok && ms != day) {
			t.Errorf("%s: %d %v, want daily %v", f, ms, ok, want)
		}
	}
}

// The full sweep drops the spend hash's monthly fields once the usage report can no longer
// reach their month (its hourly buckets lapse 400 days after their hour), and keeps every
// other: they were never dropped, a field a month per end user for ever. Those written
// before their index are indexed once.
func TestSweepPrunesSpendMonths(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	const project = "proj_months"
	if _, err := st.EnsureProject(ctx, project, project); err != nil {
		t.Fatal(err)
	}
	k := store.ProjectKeys(project)
	// What settlers before the monthly index left: months long ago and within the report's
	// reach, and the project's older entries indexed (the flag of the daily index).
	if err := rdb.HSet(ctx, k.Spend(), "m:202401", 7000, "eu:eu_9:m:202401", 7000, "m:202511", 7000, "eu:eu_9:m:202511", 7000).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, k.Indexed(), "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := NewSettler(rdb, SettlerOptions{Consumer: "c1"})
	appendAll(t, rdb, records(project, []string{"sess_m"}, 5)) // of end user eu_0, in t0's month
	for n, err := s.SettleProject(ctx, project); n > 0 || err != nil; n, err = s.SettleProject(ctx, project) {
		if err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, kept, dropped []string) {
		t.Helper()
		m, err := rdb.HGetAll(ctx, k.Spend()).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range kept {
			if _, ok := m[f]; !ok {
				t.Errorf("%s: spend field %s pruned, want it kept", when, f)
			}
		}
		for _, f := range dropped {
			if _, ok := m[f]; ok {
				t.Errorf("%s: spend field %s kept, want it pruned", when, f)
			}
		}
	}
	month := monthOf(t0)
	recent := []string{"m:" + month, "eu:eu_0:m:" + month}
	ended := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC) // t0's month's end
	s.now = func() time.Time { return t0.Add(10 * 24 * time.Hour) }
	s.sweep(ctx)
	check("10 days after", append([]string{"m:202511", "eu:eu_9:m:202511"}, recent...), []string{"m:202401", "eu:eu_9:m:202401"})
	s.now = func() time.Time { return t0.Add(40 * 24 * time.Hour) }
	s.sweep(ctx)
	check("40 days after", recent, []string{"m:202511", "eu:eu_9:m:202511"})
	s.now = func() time.Time { return ended.Add(399 * 24 * time.Hour) }
	s.sweep(ctx)
	check("399 days after its month", recent, nil)
	s.now = func() time.Time { return ended.Add(401 * 24 * time.Hour) }
	s.sweep(ctx)
	check("401 days after its month", nil, recent)
}

// monthEndOfSpendField knows the monthly fields of the spend hash from the others, by the end
// of their month.
func TestMonthEndOfSpendField(t *testing.T) {
	end := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	for f, want := range map[string]bool{
		"m:202612": true, "eu:eu_1:m:202612": true, "eu:a:m:b:m:202612": true,
		"d:20261231": false, "h:2026123110": false, "eu:eu_1:d:20261231": false, "eu:m:202612": false,
		"m:2026123": false, "m:20261x": false,
	} {
		ms, ok := monthEndOfSpendField(f)
		if ok != want || (ok && ms != end) {
			t.Errorf("%s: %d %v, want monthly %v", f, ms, ok, want)
		}
	}
}
