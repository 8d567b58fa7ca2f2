package quota

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	// c1 settles the whole stream, and dies before it acknowledges it.
	c1 := NewSettler(rdb, SettlerOptions{Consumer: "c1"})
	if err := c1.ensureGroup(ctx, "proj_u"); err != nil {
		t.Fatal(err)
	}
	res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: settlerGroup, Consumer: "c1",
		Streams: []string{store.ProjectKeys("proj_u").UsageStream(), ">"}, Count: 100, Block: -1}).Result()
	if err != nil || len(res) != 1 || len(res[0].Messages) != 20 {
		t.Fatalf("read %v, %v", res, err)
	}
	if err := c1.apply(ctx, "proj_u", c1.runs("proj_u", res[0].Messages)); err != nil {
		t.Fatal(err)
	}
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
	// Another settler claims c1's records and replays them.
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

// A run that straddles what an interrupted settler applied is settled record by record; a
// later hour's run of the same session in the same batch is applied after those records,
// not before: applied first, it moved the session's mark past them, and they counted as
// replays and were lost, from the money and from the usage to date.
func TestSettlerStraddleThenNextHour(t *testing.T) {
	for _, c := range []struct {
		name string
		// interrupt leaves seqs 1..4 applied (the money and the usage to date, or only the
		// money of all seven) and all seven to be read again in one batch.
		interrupt func(t *testing.T, rdb redis.UniversalClient, project string)
	}{
		{name: "money and usage to date straddle", interrupt: func(t *testing.T, rdb redis.UniversalClient, project string) {
			ctx := context.Background()
			s := NewSettler(rdb, SettlerOptions{Consumer: "dead"})
			if err := s.ensureGroup(ctx, project); err != nil {
				t.Fatal(err)
			}
			res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: settlerGroup, Consumer: "dead",
				Streams: []string{store.ProjectKeys(project).UsageStream(), ">"}, Count: 4}).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.apply(ctx, project, s.runs(project, res[0].Messages)); err != nil {
				t.Fatal(err)
			}
			// Another settler read the rest and died before applying it: the next reads all
			// seven in one batch.
			if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: settlerGroup, Consumer: "dead2",
				Streams: []string{store.ProjectKeys(project).UsageStream(), ">"}, Count: 10}).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "usage to date straddles", interrupt: func(t *testing.T, rdb redis.UniversalClient, project string) {
			ctx := context.Background()
			// A settler applied all seven (the money) and died before its ack (an acked
			// record leaves the stream): the group is gone, so all are read again.
			s := NewSettler(rdb, SettlerOptions{Consumer: "dead"})
			if err := s.ensureGroup(ctx, project); err != nil {
				t.Fatal(err)
			}
			res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: settlerGroup, Consumer: "dead",
				Streams: []string{store.ProjectKeys(project).UsageStream(), ">"}, Count: 10}).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := s.apply(ctx, project, s.runs(project, res[0].Messages)); err != nil {
				t.Fatal(err)
			}
			if err := rdb.HSet(ctx, store.ProjectKeys(project).SessionHash("sess_1"), "u_seq", 4, "u_ms", 4000, "u_cpu", 0, "u_mem", 0, "u_egress", 0, "cost_nano", 4*28_000).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.XGroupDestroy(ctx, store.ProjectKeys(project).UsageStream(), settlerGroup).Err(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := redistest.Server(t)
			st := store.New(rdb)
			const project = "proj_x"
			if _, err := st.Create(ctx, &session.Session{ID: "sess_1", ProjectID: project, Tier: 2, State: session.Pending,
				CreatedAt: *session.At(t0), IdleTimeoutS: 300, MaxLifetimeS: 3600}, 10); err != nil {
				t.Fatal(err)
			}
			// Seqs 1..6 end in hour 10, seq 7 in hour 11: two runs.
			var rs []Record
			for i := 1; i <= 7; i++ {
				to := t0.Add(time.Duration(i) * 8 * time.Minute)
				if i == 7 {
					to = t0.Add(61 * time.Minute)
				}
				rs = append(rs, Record{SessionID: "sess_1", ProjectID: project, Tier: 2, SizeClass: "s", Seq: int64(i),
					FromMs: to.Add(-time.Second).UnixMilli(), ToMs: to.UnixMilli(), State: session.Running, SessionMs: 1000})
			}
			appendAll(t, rdb, rs)
			c.interrupt(t, rdb, project)
			settleAll(t, rdb, project, "alive")
			var ms int64
			for _, h := range []time.Time{t0, t0.Add(time.Hour)} {
				v, err := rdb.HGet(ctx, store.ProjectKeys(project).UsageHour(h), "t:session_ms").Int64()
				if err != nil {
					t.Fatal(err)
				}
				ms += v
			}
			if ms != 7000 {
				t.Errorf("settled session_ms %d, want 7000 (7 records of 1 s)", ms)
			}
			got, err := st.Get(ctx, project, "sess_1")
			if err != nil {
				t.Fatal(err)
			}
			if got.UsageToDate.SessionS != 7 {
				t.Errorf("usage to date %d session seconds, want 7", got.UsageToDate.SessionS)
			}
		})
	}
}

// settleAll settles everything waiting in the project's stream, as consumer.
func settleAll(t *testing.T, rdb redis.UniversalClient, project, consumer string) {
	t.Helper()
	s := NewSettler(rdb, SettlerOptions{Consumer: consumer})
	for {
		n, err := s.SettleProject(context.Background(), project)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}
