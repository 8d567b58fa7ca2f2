package quota

import (
	"context"
	"testing"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// A settler that settled a batch but died before the sessions' usage to date got it (none of
// it, or part): the replay completes the usage to date, once, and leaves the money as it was.
func TestSettlerReplayCompletesSessionUsage(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	for _, id := range []string{"sess_1", "sess_2"} {
		sess := &session.Session{ID: id, ProjectID: "proj_u", Tier: 2, State: session.Pending,
			CreatedAt: *session.At(t0), IdleTimeoutS: 300, MaxLifetimeS: 3600}
		if _, err := st.Create(ctx, sess, 10); err != nil {
			t.Fatal(err)
		}
	}
	appendAll(t, rdb, records("proj_u", []string{"sess_1", "sess_2"}, 10))
	settleAll := func(consumer string) {
		t.Helper()
		s := NewSettler(rdb, SettlerOptions{Consumer: consumer})
		for {
			n, err := s.SettleProject(ctx, "proj_u")
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	settleAll("c1")
	money := counters(t, rdb, "proj_u")
	want := session.Usage{SessionS: 10, CPUMs: 100, MemGiBMs: 5000, EgressBytes: 10_000}
	check := func(when string) {
		t.Helper()
		for _, id := range []string{"sess_1", "sess_2"} {
			got, err := st.Get(ctx, "proj_u", id)
			if err != nil {
				t.Fatal(err)
			}
			if got.UsageToDate != want {
				t.Fatalf("%s: %s usage to date %+v, want %+v", when, id, got.UsageToDate, want)
			}
		}
	}
	check("settled")

	// The crash: sess_1 never got its usage, sess_2 got seqs 1..4 only.
	fields := []string{"u_seq", "u_ms", "u_paused_ms", "u_cpu", "u_mem", "u_egress", "cost_nano"}
	if err := rdb.HDel(ctx, "wb:{proj_u}:s:sess_1", fields...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, "wb:{proj_u}:s:sess_2", "u_seq", 4, "u_ms", 4000, "u_cpu", 40, "u_mem", 2000, "u_egress", 4000).Err(); err != nil {
		t.Fatal(err)
	}
	// Another settler replays the whole stream.
	if err := rdb.XGroupDestroy(ctx, store.ProjectKeys("proj_u").UsageStream(), settlerGroup).Err(); err != nil {
		t.Fatal(err)
	}
	settleAll("c2")
	check("replayed")
	if got := counters(t, rdb, "proj_u"); len(got) != len(money) {
		t.Fatalf("the replay changed the money: %v, was %v", got, money)
	} else {
		for k, v := range money {
			if got[k] != v {
				t.Fatalf("the replay changed %s: %s, was %s", k, got[k], v)
			}
		}
	}
}
