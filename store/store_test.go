package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// TestStore runs the whole suite against a real redis-server, miniredis and a 3-node Cluster.
func TestStore(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		fn   func(t *testing.T, s *Store, project string)
	}{
		{"CreateGet", testCreateGet},
		{"ConcurrencyLimit", testConcurrencyLimit},
		{"Lifecycle", testLifecycle},
		{"RejectsIllegal", testRejectsIllegal},
		{"StoppingKeepsReason", testStoppingKeepsReason},
		{"List", testList},
		{"RaceOneSession", testRaceOneSession},
		{"RaceCreates", testRaceCreates},
		{"Retention", testRetention},
		{"RetainedIndexes", testRetainedIndexes},
		{"TrimLapsed", testTrimLapsed},
		{"SnapshotGuard", testSnapshotGuard},
		{"StartsAnnounced", testStartsAnnounced},
	}
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					s, p := New(rdb, WithRetention(time.Hour)), fmt.Sprintf("proj_%s%d", c.name, i)
					withEndpoint(t, s, p)
					c.fn(t, s, p)
				})
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func newPending(project string, endUser string) *session.Session {
	now := time.Now()
	s := &session.Session{
		ID: session.NewID("sess_", now), Object: session.ObjectName, Tier: 2, State: session.Pending,
		ProjectID: project, Template: "tpl_base@sha256:abc", Region: "local",
		Resources:    session.Resources{VCPU: 1, MemoryMiB: 2048, DiskGiB: 10, SizeClass: "s"},
		IdleTimeoutS: 300, MaxLifetimeS: 3600, CreatedAt: *session.At(now),
		PolicyID: ptr("pol_x@1"), Metadata: map[string]string{"k": "v"},
	}
	if endUser != "" {
		s.EndUserID = &endUser
	}
	return s
}

// withEndpoint gives project a webhook endpoint, as webhooks' registry writes one, so that
// its creates write their session.pending event (write_pending: not for a project with none).
func withEndpoint(t testing.TB, s *Store, project string) {
	t.Helper()
	if err := s.rdb.HSet(context.Background(), ProjectKeys(project).Webhooks().Endpoints(), "we_test", "{}").Err(); err != nil {
		t.Fatal(err)
	}
}

func mustCreate(t *testing.T, s *Store, sess *session.Session, limit int) *session.Session {
	t.Helper()
	out, err := s.Create(context.Background(), sess, limit)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func step(t *testing.T, s *Store, c Change) *session.Session {
	t.Helper()
	out, err := s.Transition(context.Background(), c)
	if err != nil {
		t.Fatalf("%s→%s: %v", c.From, c.To, err)
	}
	if out.State != c.To {
		t.Fatalf("state %s, want %s", out.State, c.To)
	}
	return out
}

func outbox(t *testing.T, s *Store, project string) []redis.XMessage {
	t.Helper()
	msgs, err := s.rdb.XRange(context.Background(), Outbox(project), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func testCreateGet(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	in := newPending(p, "eu_1")
	mustCreate(t, s, in, 10)
	got, err := s.Get(ctx, p, in.ID)
	if err != nil {
		t.Fatal(err)
	}
	in.Version = 1
	if !reflect.DeepEqual(got, in) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", *got, *in)
	}
	if _, err := s.Get(ctx, "proj_other", in.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another project read it: %v", err)
	}
	if _, err := s.Create(ctx, in, 10); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate id: %v", err)
	}
	if n, _ := s.ActiveCount(ctx, p); n != 1 {
		t.Fatalf("active %d after a failed duplicate", n)
	}
	ev := outbox(t, s, p)
	if len(ev) != 1 || ev[0].Values["type"] != session.EventPending || ev[0].Values["session_id"] != in.ID {
		t.Fatalf("outbox %v", ev)
	}
}

func testConcurrencyLimit(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	a := mustCreate(t, s, newPending(p, ""), 2)
	mustCreate(t, s, newPending(p, ""), 2)
	_, err := s.Create(ctx, newPending(p, ""), 2)
	var ce *ConcurrencyError
	if !errors.As(err, &ce) || ce.Limit != 2 || ce.Used != 2 {
		t.Fatalf("third create: %v", err)
	}
	if len(outbox(t, s, p)) != 2 {
		t.Fatal("a refused create wrote an event")
	}
	step(t, s, Change{Project: p, ID: a.ID, From: session.Pending, To: session.Stopped, Driver: session.Caller, Reason: session.Deleted})
	mustCreate(t, s, newPending(p, ""), 2)
}

func testLifecycle(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	sess := mustCreate(t, s, newPending(p, ""), 5)
	c := func(from, to session.State, d session.Driver, r session.Reason) Change {
		return Change{Project: p, ID: sess.ID, From: from, To: to, Driver: d, Reason: r}
	}
	pc := c(session.Pending, session.Provisioning, session.Placer, "")
	pc.Zone, pc.NodeID = "local-a", "node_1"
	got := step(t, s, pc)
	if *got.Zone != "local-a" || got.NodeID != "node_1" || got.Version != 2 {
		t.Fatalf("placement not recorded: %+v", got)
	}
	rc := c(session.Provisioning, session.Running, session.Node, "")
	rc.ColdStart = ptr(false)
	before := time.Now().Add(-time.Second)
	got = step(t, s, rc)
	if got.StartedAt == nil || got.StartedAt.Before(before) || *got.ColdStart {
		t.Fatalf("started_at %v cold %v", got.StartedAt, got.ColdStart)
	}
	if !got.ExpiresAt.Equal(got.StartedAt.Add(time.Hour)) || !got.LastActivityAt.Equal(got.StartedAt.Time) {
		t.Fatalf("expires_at %v activity %v for started %v", got.ExpiresAt, got.LastActivityAt, got.StartedAt)
	}
	got = step(t, s, c(session.Running, session.Paused, session.Caller, ""))
	if got.PausedAt == nil {
		t.Fatal("paused_at not set")
	}
	got = step(t, s, c(session.Paused, session.Running, session.Caller, ""))
	if got.PausedAt != nil {
		t.Fatal("paused_at not cleared on resume")
	}
	step(t, s, c(session.Running, session.Snapshotting, session.Caller, ""))
	step(t, s, c(session.Snapshotting, session.Running, session.Caller, ""))
	got = step(t, s, c(session.Running, session.Stopping, session.Caller, session.Deleted))
	if *got.StateReason != session.Deleted {
		t.Fatal("reason not recorded")
	}
	if n, _ := s.ActiveCount(ctx, p); n != 1 {
		t.Fatalf("slot released before stopped: %d", n)
	}
	got = step(t, s, c(session.Stopping, session.Stopped, session.Node, session.Deleted))
	if got.StoppedAt == nil || got.Version != 9 {
		t.Fatalf("stopped_at %v version %d", got.StoppedAt, got.Version)
	}
	if n, _ := s.ActiveCount(ctx, p); n != 0 {
		t.Fatalf("slot leaked: %d", n)
	}
	var types []string
	for i, m := range outbox(t, s, p) {
		types = append(types, m.Values["type"].(string))
		if m.Values["version"] != fmt.Sprint(i+1) {
			t.Errorf("event %d version %v", i, m.Values["version"])
		}
	}
	want := []string{session.EventPending, session.EventProvisioning, session.EventRunning, session.EventPaused,
		session.EventResumed, session.EventSnapshotting, session.EventSnapshotted, session.EventStopping, session.EventStopped}
	if !slices.Equal(types, want) {
		t.Fatalf("outbox %v\nwant %v", types, want)
	}
	page, err := s.List(ctx, p, ListQuery{State: session.Stopped})
	if err != nil || len(page.Sessions) != 1 {
		t.Fatalf("state index: %v %v", page, err)
	}
	page, _ = s.List(ctx, p, ListQuery{State: session.Running})
	if len(page.Sessions) != 0 {
		t.Fatal("left in the running index")
	}
}

func testRejectsIllegal(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	sess := mustCreate(t, s, newPending(p, ""), 5)
	_, err := s.Transition(ctx, Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Provisioning, Driver: session.Caller})
	var te *session.TransitionError
	if !errors.As(err, &te) {
		t.Fatalf("wrong driver: %v", err)
	}
	_, err = s.Transition(ctx, Change{Project: p, ID: sess.ID, From: session.Pending, To: "bogus", Driver: session.Placer})
	var fe *session.FieldError
	if !errors.As(err, &fe) || fe.Field != "to" {
		t.Fatalf("unknown state: %v", err)
	}
	_, err = s.Transition(ctx, Change{Project: p, ID: sess.ID, From: session.Running, To: session.Stopping, Driver: session.Caller, Reason: "bored"})
	if !errors.As(err, &fe) || fe.Field != "reason" {
		t.Fatalf("unknown reason: %v", err)
	}
	_, err = s.Transition(ctx, Change{Project: p, ID: sess.ID, From: session.Running, To: session.Paused, Driver: session.Caller})
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Current != session.Pending || ce.Version != 1 {
		t.Fatalf("wrong from: %v", err)
	}
	_, err = s.Transition(ctx, Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Provisioning, Driver: session.Placer, Version: 7})
	if !errors.As(err, &ce) {
		t.Fatalf("wrong version: %v", err)
	}
	_, err = s.Transition(ctx, Change{Project: p, ID: "sess_missing", From: session.Pending, To: session.Provisioning, Driver: session.Placer})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if got, _ := s.Get(ctx, p, sess.ID); got.State != session.Pending || got.Version != 1 {
		t.Fatalf("a refused transition changed the session: %+v", got)
	}
	if len(outbox(t, s, p)) != 1 {
		t.Fatal("a refused transition wrote an event")
	}
}

func testStoppingKeepsReason(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	sess := mustCreate(t, s, newPending(p, ""), 5)
	step(t, s, Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Provisioning, Driver: session.Placer})
	step(t, s, Change{Project: p, ID: sess.ID, From: session.Provisioning, To: session.Running, Driver: session.Node})
	pk := Change{Project: p, ID: sess.ID, From: session.Running, To: session.Stopping, Driver: session.Policy, Reason: session.PolicyViolation, Rule: "no_curl"}
	step(t, s, pk)
	_, err := s.Transition(ctx, Change{Project: p, ID: sess.ID, From: session.Stopping, To: session.Stopped, Driver: session.Node, Reason: session.Deleted})
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("a policy kill ended as deleted: %v", err)
	}
	got := step(t, s, Change{Project: p, ID: sess.ID, From: session.Stopping, To: session.Failed, Driver: session.Node, Reason: session.PolicyViolation, Rule: "no_curl"})
	if *got.StateReason != session.PolicyViolation || *got.Rule != "no_curl" {
		t.Fatalf("reason %v rule %v", got.StateReason, got.Rule)
	}
	ev := outbox(t, s, p)
	last := ev[len(ev)-1].Values
	if last["type"] != session.EventFailed || last["reason"] != "policy_violation" || last["rule"] != "no_curl" {
		t.Fatalf("event %v", last)
	}
}

func testList(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	var ids []string
	for i := 0; i < 25; i++ {
		eu := "eu_a"
		if i%2 == 1 {
			eu = "eu_b"
		}
		sess := newPending(p, eu)
		sess.ID = session.NewID("sess_", time.Now().Add(time.Duration(i)*time.Millisecond))
		mustCreate(t, s, sess, 100)
		ids = append(ids, sess.ID)
		if i%5 == 0 {
			step(t, s, Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Provisioning, Driver: session.Placer})
		}
	}
	slices.Reverse(ids) // newest first
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, err := s.List(ctx, p, ListQuery{Limit: 10, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range page.Sessions {
			got = append(got, x.ID)
		}
		if page.NextCursor == "" {
			if pages != 2 {
				t.Fatalf("%d pages", pages+1)
			}
			break
		}
		cursor = page.NextCursor
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("paging:\n got %v\nwant %v", got, ids)
	}
	count := func(q ListQuery) int {
		n, cursor := 0, ""
		for {
			q.Cursor = cursor
			page, err := s.List(ctx, p, q)
			if err != nil {
				t.Fatal(err)
			}
			n += len(page.Sessions)
			if cursor = page.NextCursor; cursor == "" {
				return n
			}
		}
	}
	if n := count(ListQuery{State: session.Provisioning, Limit: 2}); n != 5 {
		t.Fatalf("provisioning: %d", n)
	}
	if n := count(ListQuery{EndUserID: "eu_a", Limit: 3}); n != 13 {
		t.Fatalf("eu_a: %d", n)
	}
	if n := count(ListQuery{EndUserID: "eu_b", State: session.Provisioning}); n != 2 {
		t.Fatalf("eu_b provisioning: %d", n)
	}
	if n := count(ListQuery{EndUserID: "eu_none"}); n != 0 {
		t.Fatalf("eu_none: %d", n)
	}
	var fe *session.FieldError
	for _, q := range []ListQuery{{Limit: 101}, {Limit: -1}, {Cursor: "(+"}, {State: "bogus"}} {
		if _, err := s.List(ctx, p, q); !errors.As(err, &fe) {
			t.Errorf("%+v: %v", q, err)
		}
	}
	if page, _ := s.List(ctx, "proj_nobody", ListQuery{}); len(page.Sessions) != 0 {
		t.Fatal("another project listed sessions")
	}
}

// 64 goroutines race conflicting transitions on one session at every step. Exactly one wins
// each step; the outbox holds exactly the winners' events, in order; the slot is released once.
func testRaceOneSession(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	const workers = 64
	for round := 0; round < 4; round++ {
		sess := mustCreate(t, s, newPending(p, ""), 1)
		var winners []Change
		for cur := sess.State; !cur.Terminal(); {
			var cands []Change
			for _, r := range session.Rules() {
				if r.From != cur {
					continue
				}
				reasons := r.Reasons
				if len(reasons) == 0 {
					reasons = []session.Reason{""}
				}
				for _, reason := range reasons {
					cands = append(cands, Change{Project: p, ID: sess.ID, From: cur, To: r.To, Driver: r.Driver, Reason: reason})
				}
			}
			// Rotate so that different rounds take different paths, and make some loops
			// (snapshotting, pause) finite.
			slices.SortFunc(cands, func(a, b Change) int { return (int(a.To[0])*7+round)%5 - (int(b.To[0])*7+round)%5 })
			if len(winners) > 12 {
				cands = slices.DeleteFunc(cands, func(c Change) bool { return !c.To.Terminal() && c.To != session.Stopping })
			}
			var wins atomic.Int32
			var won Change
			var mu sync.Mutex
			var wg sync.WaitGroup
			start := make(chan struct{})
			for w := 0; w < workers; w++ {
				c := cands[w%len(cands)]
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					out, err := s.Transition(ctx, c)
					if err == nil {
						wins.Add(1)
						mu.Lock()
						won = c
						mu.Unlock()
						if out.State != c.To {
							t.Errorf("winner got state %s", out.State)
						}
						return
					}
					var ce *ConflictError
					if !errors.As(err, &ce) {
						t.Errorf("loser got %v", err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if wins.Load() != 1 {
				t.Fatalf("step from %s: %d winners", cur, wins.Load())
			}
			winners = append(winners, won)
			if n, err := s.ActiveCount(ctx, p); err != nil || n < 0 || n > 1 {
				t.Fatalf("active %d %v", n, err)
			}
			cur = won.To
		}
		if n, _ := s.ActiveCount(ctx, p); n != 0 {
			t.Fatalf("slot leaked after %v", winners)
		}
		var got []string
		for _, m := range outbox(t, s, p) {
			if m.Values["session_id"] == sess.ID && m.Values["type"] != session.EventPending {
				got = append(got, fmt.Sprintf("%s>%s/%s/%s", m.Values["from"], m.Values["to"], m.Values["driver"], m.Values["reason"]))
			}
		}
		var want []string
		for _, w := range winners {
			want = append(want, fmt.Sprintf("%s>%s/%s/%s", w.From, w.To, w.Driver, w.Reason))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("outbox\n got %v\nwant %v", got, want)
		}
	}
}

// 64 goroutines create against a limit of 10, then race to stop them all: exactly 10 get a
// slot, and every slot comes back.
func testRaceCreates(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	var mu sync.Mutex
	var made []*session.Session
	var limited atomic.Int32
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := s.Create(ctx, newPending(p, ""), 10)
			var ce *ConcurrencyError
			switch {
			case err == nil:
				mu.Lock()
				made = append(made, out)
				mu.Unlock()
			case errors.As(err, &ce):
				limited.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if len(made) != 10 || limited.Load() != 54 {
		t.Fatalf("%d created, %d limited", len(made), limited.Load())
	}
	var stops atomic.Int32
	for _, sess := range made {
		for w := 0; w < 6; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Stopped, Driver: session.Caller, Reason: session.Deleted}
				if w%2 == 1 {
					c = Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Failed, Driver: session.Timer, Reason: session.ProvisionTimeout}
				}
				if _, err := s.Transition(ctx, c); err == nil {
					stops.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if stops.Load() != 10 {
		t.Fatalf("%d terminal transitions for 10 sessions", stops.Load())
	}
	if n, _ := s.ActiveCount(ctx, p); n != 0 {
		t.Fatalf("%d slots leaked", n)
	}
}

func testRetention(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	sess := mustCreate(t, s, newPending(p, ""), 5)
	key := ProjectKeys(p).session(sess.ID)
	if ttl, _ := s.rdb.TTL(ctx, key).Result(); ttl > 0 {
		t.Fatalf("live session has a TTL %s", ttl)
	}
	step(t, s, Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Stopped, Driver: session.Caller, Reason: session.Deleted})
	if ttl, _ := s.rdb.TTL(ctx, key).Result(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("terminal TTL %s, want ≤ 1h", ttl)
	}
}

// testRetainedIndexes: once an ended session's retention lapsed and Redis expired its hash,
// the next ending in its project drops its entries from the all, state and end-user indexes
// without a listing, at most retainedTrimBatch per ending; one whose hash is still there
// (Redis's clock behind the store's) keeps them.
func testRetainedIndexes(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	var at atomic.Pointer[time.Time]
	now := time.Now()
	at.Store(&now)
	s = New(s.rdb, WithRetention(time.Hour), WithClock(func() time.Time { return *at.Load() }))
	k := ProjectKeys(p)
	end := func(endUser string) string {
		sess := mustCreate(t, s, newPending(p, endUser), 100)
		step(t, s, Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Stopped, Driver: session.Caller, Reason: session.Deleted})
		return sess.ID
	}
	indexed := func(id, endUser string) []string {
		var in []string
		for _, key := range []string{k.all(), k.byState(session.Stopped), k.byEndUser(endUser)} {
			if _, err := s.rdb.ZScore(ctx, key, id).Result(); err == nil {
				in = append(in, key)
			}
		}
		return in
	}
	n := retainedTrimBatch + 4
	var lapsed []string
	for range n {
		lapsed = append(lapsed, end("eu_gone"))
	}
	kept := end("eu_kept") // its hash lives on past its score
	for _, id := range lapsed {
		if len(indexed(id, "eu_gone")) != 3 {
			t.Fatalf("an ended session is not indexed: %v", indexed(id, "eu_gone"))
		}
		s.rdb.Del(ctx, k.session(id)) // what Redis does when the retention lapses
	}
	later := now.Add(time.Hour + time.Second)
	at.Store(&later)
	stale := func() (ids []string) {
		for _, id := range lapsed {
			if len(indexed(id, "eu_gone")) > 0 {
				ids = append(ids, id)
			}
		}
		return ids
	}
	end("")
	if left := stale(); len(left) != n-retainedTrimBatch {
		t.Fatalf("after one ending, %d of %d lapsed sessions are still indexed, want %d", len(left), n, n-retainedTrimBatch)
	}
	fresh := end("eu_fresh")
	if left := stale(); len(left) != 0 {
		t.Fatalf("after two endings, lapsed sessions are still indexed: %v in %v", left, indexed(left[0], "eu_gone"))
	}
	if got := indexed(kept, "eu_kept"); len(got) != 3 {
		t.Fatalf("a session whose hash lives on lost index entries: in %v", got)
	}
	if got := indexed(fresh, "eu_fresh"); len(got) != 3 {
		t.Fatalf("a fresh ended session lost index entries: in %v", got)
	}
	if ms, _ := s.rdb.ZRange(ctx, k.retained(), 0, -1).Result(); len(ms) != 3 {
		t.Fatalf("retained set %v, want the kept session and the two that ended last", ms)
	}
}

// testTrimLapsed: a project whose sessions stopped ending keeps no index entries of those
// whose retention lapsed once TrimLapsed has walked it, however many more than an ending's
// batch; one whose hash is still there keeps them, and so does another project's.
func testTrimLapsed(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	var at atomic.Pointer[time.Time]
	now := time.Now()
	at.Store(&now)
	s = New(s.rdb, WithRetention(time.Hour), WithClock(func() time.Time { return *at.Load() }))
	other := p + "_other"
	end := func(project string) string {
		sess := mustCreate(t, s, newPending(project, "eu_1"), 1000)
		step(t, s, Change{Project: project, ID: sess.ID, From: session.Pending, To: session.Stopped, Driver: session.Caller, Reason: session.Deleted})
		return sess.ID
	}
	n := 3*retainedTrimBatch + 5
	var lapsed []string
	for range n {
		id := end(p)
		lapsed = append(lapsed, id)
		s.rdb.Del(ctx, ProjectKeys(p).session(id)) // what Redis does when the retention lapses
	}
	kept := end(p) // its hash lives on past its score
	otherID := end(other)
	later := now.Add(time.Hour + time.Second)
	at.Store(&later)

	if err := s.TrimLapsed(ctx, []string{"proj_none", p, other}); err != nil {
		t.Fatal(err)
	}
	k := ProjectKeys(p)
	var stale []string
	for _, id := range lapsed {
		for _, key := range []string{k.all(), k.byState(session.Stopped), k.byEndUser("eu_1")} {
			if _, err := s.rdb.ZScore(ctx, key, id).Result(); err == nil {
				stale = append(stale, id+" in "+key)
			}
		}
	}
	if len(stale) > 0 {
		t.Fatalf("after TrimLapsed, %d index entries of %d lapsed sessions are left (first %s), with no ending since", len(stale), n, stale[0])
	}
	if _, err := s.rdb.ZScore(ctx, k.all(), kept).Result(); err != nil {
		t.Errorf("a session whose hash lives on lost its index entry: %v", err)
	}
	if _, err := s.rdb.ZScore(ctx, ProjectKeys(other).all(), otherID).Result(); err != nil {
		t.Errorf("another project's session whose hash lives on lost its index entry: %v", err)
	}
}

func TestEventCarriesSession(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Mini(t)
	s := New(rdb)
	p := "proj_ev"
	withEndpoint(t, s, p)
	sess := mustCreate(t, s, newPending(p, "eu_9"), 5)
	step(t, s, Change{Project: p, ID: sess.ID, From: session.Pending, To: session.Provisioning, Driver: session.Placer, Zone: "z1"})
	msgs := outbox(t, s, p)
	if len(msgs) != 2 {
		t.Fatalf("%d events", len(msgs))
	}
	for i, want := range []session.State{session.Pending, session.Provisioning} {
		ev, err := DecodeEvent(msgs[i].ID, msgs[i].Values)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Session == nil || ev.Session.State != want || ev.Version != int64(i+1) || ev.Session.Version != ev.Version {
			t.Fatalf("event %d: %+v", i, ev)
		}
		if *ev.Session.EndUserID != "eu_9" || ev.SessionID != sess.ID || ev.ProjectID != p {
			t.Fatalf("event %d session %+v", i, ev.Session)
		}
	}
	if _, err := DecodeEvent("1-0", map[string]any{"x": "y"}); err == nil {
		t.Fatal("garbage decoded")
	}
}

func TestAppendEvent(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Mini(t)
	s := New(rdb)
	id, err := s.AppendEvent(context.Background(), "proj_a", session.EventSnapshotReady, "sess_1", map[string]any{"id": "snap_1"})
	if err != nil {
		t.Fatal(err)
	}
	msgs := outbox(t, s, "proj_a")
	ev, err := DecodeEvent(msgs[0].ID, msgs[0].Values)
	if err != nil || ev.ID != id || ev.Type != session.EventSnapshotReady || ev.SessionID != "sess_1" || string(ev.Object) != `{"id":"snap_1"}` || ev.Session != nil {
		t.Fatalf("%+v %v", ev, err)
	}
}

func TestObjects(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Mini(t)
	s := New(rdb)
	ctx := context.Background()
	var ids []string
	for i := 0; i < 5; i++ {
		snap := session.Snapshot{ID: session.NewID("snap_", time.Now().Add(time.Duration(i)*time.Millisecond)), Object: "snapshot", State: session.SnapshotReady}
		ids = append(ids, snap.ID)
		if err := s.PutObject(ctx, "proj_a", KindSnapshot, snap.ID, snap); err != nil {
			t.Fatal(err)
		}
	}
	var got session.Snapshot
	if err := s.GetObject(ctx, "proj_a", KindSnapshot, ids[0], &got); err != nil || got.ID != ids[0] {
		t.Fatalf("%v %v", got, err)
	}
	if err := s.GetObject(ctx, "proj_b", KindSnapshot, ids[0], &got); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another project: %v", err)
	}
	page, next, err := s.ListObjects(ctx, "proj_a", KindSnapshot, 3, "")
	if err != nil || len(page) != 3 || next != ids[2] {
		t.Fatalf("page 1: %d %q %v", len(page), next, err)
	}
	page, next, err = s.ListObjects(ctx, "proj_a", KindSnapshot, 3, next)
	if err != nil || len(page) != 2 || next != "" {
		t.Fatalf("page 2: %d %q %v", len(page), next, err)
	}
	if _, _, err := s.ListObjects(ctx, "proj_a", KindSnapshot, 3, "(bad"); err == nil {
		t.Fatal("bad cursor accepted")
	}
	if err := s.DeleteObject(ctx, "proj_a", KindSnapshot, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteObject(ctx, "proj_a", KindSnapshot, ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestIdempotency(t *testing.T) {
	t.Parallel()
	rdb, _ := redistest.Mini(t)
	s := New(rdb)
	ctx := context.Background()
	rec, c, err := s.IdemBegin(ctx, "p", "k1", "fp1")
	if rec != nil || c == nil || c.Ref == "" || c.Resumed || err != nil {
		t.Fatalf("first: %v %+v %v", rec, c, err)
	}
	if _, _, err := s.IdemBegin(ctx, "p", "k1", "fp1"); !errors.Is(err, ErrIdemInFlight) {
		t.Fatalf("in flight: %v", err)
	}
	if err := s.IdemFinish(ctx, "p", "k1", c, IdemRecord{Fingerprint: "fp1", Status: 201, Body: []byte("{}")}, nil, 0); err != nil {
		t.Fatal(err)
	}
	rec, _, err = s.IdemBegin(ctx, "p", "k1", "fp1")
	if err != nil || rec.Status != 201 || string(rec.Body) != "{}" {
		t.Fatalf("replay: %+v %v", rec, err)
	}
	if _, _, err := s.IdemBegin(ctx, "p", "k1", "fp2"); !errors.Is(err, ErrIdemMismatch) {
		t.Fatalf("mismatch: %v", err)
	}
	if rec, c, err := s.IdemBegin(ctx, "q", "k1", "fp2"); rec != nil || c == nil || err != nil {
		t.Fatal("keys are not per project")
	}
	if ttl := rdb.TTL(ctx, ProjectKeys("p").idempotency("k1")).Val(); ttl <= 23*time.Hour {
		t.Fatalf("ttl %s", ttl)
	}
}

// TestIdempotencyTakeover: a request whose gateway dies holding a key stops renewing its
// lease; once the lease lapses a retry takes the key over with the same ref (it may find
// what the dead request created), and the dead request's late answer cannot overwrite the
// retry's. Before leases, the key answered "in progress" for its whole 24 h.
func TestIdempotencyTakeover(t *testing.T) {
	t.Parallel()
	rdb, m := redistest.Mini(t)
	s := New(rdb, WithIdemLease(3*time.Second))
	ctx := context.Background()
	_, dead, err := s.IdemBegin(ctx, "p", "k", "fp")
	if err != nil {
		t.Fatal(err)
	}
	m.FastForward(2 * time.Second)
	if _, _, err := s.IdemBegin(ctx, "p", "k", "fp"); !errors.Is(err, ErrIdemInFlight) {
		t.Fatalf("within the lease: %v", err)
	}
	if ok, err := s.IdemRenew(ctx, "p", "k", dead); !ok || err != nil {
		t.Fatalf("renew: %v %v", ok, err)
	}
	m.FastForward(2 * time.Second) // 4 s after the claim, 2 s after the renewal
	if _, _, err := s.IdemBegin(ctx, "p", "k", "fp"); !errors.Is(err, ErrIdemInFlight) {
		t.Fatalf("within the renewed lease: %v", err)
	}
	m.FastForward(2 * time.Second) // the holder died: no renewal
	if _, _, err := s.IdemBegin(ctx, "p", "k", "other"); !errors.Is(err, ErrIdemMismatch) {
		t.Fatalf("another body after the lease: %v", err)
	}
	rec, retry, err := s.IdemBegin(ctx, "p", "k", "fp")
	if err != nil || rec != nil || retry == nil || !retry.Resumed || retry.Ref != dead.Ref {
		t.Fatalf("after the lease lapsed: %+v %+v %v, want a resumed claim with ref %s", rec, retry, err, dead.Ref)
	}
	if _, _, err := s.IdemBegin(ctx, "p", "k", "fp"); !errors.Is(err, ErrIdemInFlight) {
		t.Fatalf("the retry holds the key: %v", err)
	}
	if ok, _ := s.IdemRenew(ctx, "p", "k", dead); ok {
		t.Fatal("the dead request renewed a lease it lost")
	}
	if err := s.IdemFinish(ctx, "p", "k", dead, IdemRecord{Fingerprint: "fp", Status: 500}, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.IdemFinish(ctx, "p", "k", retry, IdemRecord{Fingerprint: "fp", Status: 201, Body: []byte("{}")}, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.IdemRelease(ctx, "p", "k", dead, true); err != nil {
		t.Fatal(err)
	}
	if rec, _, err := s.IdemBegin(ctx, "p", "k", "fp"); err != nil || rec == nil || rec.Status != 201 || rec.Ref != dead.Ref {
		t.Fatalf("the answer: %+v %v, want the retry's 201", rec, err)
	}

	// Released (a retryable failure): the next request takes over at once, with the ref.
	_, c, _ := s.IdemBegin(ctx, "p", "r", "fp")
	if err := s.IdemRelease(ctx, "p", "r", c, false); err != nil {
		t.Fatal(err)
	}
	if _, again, err := s.IdemBegin(ctx, "p", "r", "fp"); err != nil || again == nil || !again.Resumed || again.Ref != c.Ref {
		t.Fatalf("after a release: %+v %v", again, err)
	}
	// Forgotten (refused: nothing written): the key is new again, for any body.
	_, c, _ = s.IdemBegin(ctx, "p", "f", "fp")
	if err := s.IdemRelease(ctx, "p", "f", c, true); err != nil {
		t.Fatal(err)
	}
	if _, again, err := s.IdemBegin(ctx, "p", "f", "other"); err != nil || again == nil || again.Resumed || again.Ref == c.Ref {
		t.Fatalf("after forgetting: %+v %v", again, err)
	}
	// A claim of a gateway from before leases (no ref, no lease) is in flight, as then: its
	// gateway renews nothing, and a takeover could run its request twice.
	if err := rdb.Set(ctx, ProjectKeys("p").idempotency("old"), `{"fp":"fp","done":false}`, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.IdemBegin(ctx, "p", "old", "fp"); !errors.Is(err, ErrIdemInFlight) {
		t.Fatalf("an old gateway's claim: %v", err)
	}
}

// testSnapshotGuard: a transition from snapshotting that names a snapshot applies only while
// the session takes that one (a late close of an older snapshot must not end a newer one), a
// session whose hash names none (written before the field) takes any, and leaving
// snapshotting forgets the one it took.
func testSnapshotGuard(t *testing.T, s *Store, p string) {
	ctx := context.Background()
	sess := mustCreate(t, s, newPending(p, ""), 5)
	c := func(from, to session.State, d session.Driver, snap string) Change {
		return Change{Project: p, ID: sess.ID, From: from, To: to, Driver: d, Snapshot: snap}
	}
	step(t, s, c(session.Pending, session.Provisioning, session.Placer, ""))
	step(t, s, c(session.Provisioning, session.Running, session.Node, ""))
	step(t, s, c(session.Running, session.Snapshotting, session.Caller, "snap_new"))
	// A lease the placer's sweep gives it (its gateway died before taking one) is held by the
	// snapshot it takes.
	ref := SessionRef{Project: p, ID: sess.ID}
	if err := s.EnsureSnapshotWork(ctx, ref, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if holder, ok, err := s.ClaimSnapshotWork(ctx, ref, time.Now(), time.Now().Add(time.Minute)); err != nil || !ok || holder != "snap_new" {
		t.Fatalf("claim of the sweep's lease: %q, %v, %v; want snap_new's", holder, ok, err)
	}
	if ok, err := s.ReleaseSnapshotWork(ctx, ref, "snap_new"); err != nil || !ok {
		t.Fatalf("release of the sweep's lease: %v, %v", ok, err)
	}
	_, err := s.Transition(ctx, c(session.Snapshotting, session.Running, session.Caller, "snap_old"))
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Current != session.Snapshotting || ce.Snapshot != "snap_new" {
		t.Fatalf("a close naming another snapshot: %v (%+v), want a conflict naming snap_new", err, ce)
	}
	step(t, s, c(session.Snapshotting, session.Running, session.Caller, "snap_new"))
	step(t, s, c(session.Running, session.Snapshotting, session.Caller, "")) // names none
	got := step(t, s, c(session.Snapshotting, session.Running, session.Caller, "snap_any"))
	if got.State != session.Running {
		t.Fatalf("after a close of a snapshot the session did not name: %s", got.State)
	}
	// A second close of snap_new, late: the session left snapshotting, so it is refused by state.
	if _, err := s.Transition(ctx, c(session.Snapshotting, session.Running, session.Caller, "snap_new")); !errors.As(err, &ce) || ce.Current != session.Running {
		t.Fatalf("a late close after the session runs again: %v, want a conflict (running)", err)
	}
	// One an older gateway left in place (it did not forget it on the way out) does not
	// outlive the next snapshot's start.
	if err := s.rdb.HSet(ctx, ProjectKeys(p).session(sess.ID), "snap", "snap_stale").Err(); err != nil {
		t.Fatal(err)
	}
	step(t, s, c(session.Running, session.Snapshotting, session.Caller, ""))
	step(t, s, c(session.Snapshotting, session.Running, session.Caller, "snap_mine"))
}
