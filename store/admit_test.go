package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// TestAdmit: a create's admission in one script, against redis-server, miniredis and a
// Cluster (every key in the project's slot): each refusal in its order, and nothing written
// but the token a refused create took.
func TestAdmit(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			ctx := context.Background()
			at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
			s := New(rdb, WithClock(func() time.Time { return at }))
			p := "proj_admit" + b.Name
			k := ProjectKeys(p)
			withEndpoint(t, s, p)
			a := Admission{RatePerSec: 1, Burst: 2, CapMonth: "202612", Concurrency: 2}
			// check is a decided create's first step alone (Reserve), its slot given back.
			probes := 0
			check := func(eu string, a Admission) (Reservation, error) {
				probes++
				r, err := s.Reserve(ctx, p, fmt.Sprintf("sess_probe%d", probes), eu, a)
				if err == nil {
					err = s.Release(ctx, r)
				}
				return r, err
			}

			// Two tokens, two slots: two admitted, then the bucket is empty.
			for i := range 2 {
				out, err := s.Admit(ctx, newPending(p, "eu_1"), a)
				if err != nil || out.Active != int64(i) || out.SoftCapped || out.Session.Version != 1 {
					t.Fatalf("create %d: %+v, %v", i, out, err)
				}
			}
			var re *RateLimitError
			if _, err := s.Admit(ctx, newPending(p, "eu_1"), a); !errors.As(err, &re) || re.Wait != time.Second {
				t.Fatalf("over the rate: %v", err)
			}
			// A second later one token is back, but both slots are taken.
			at = at.Add(time.Second)
			var ce *ConcurrencyError
			if _, err := s.Admit(ctx, newPending(p, "eu_1"), a); !errors.As(err, &ce) || ce.Used != 2 || ce.Limit != 2 {
				t.Fatalf("over the concurrency: %v", err)
			}
			// The token that create took stays taken (as when the rate limit was its own call).
			if _, err := check("", a); !errors.As(err, &re) {
				t.Fatalf("the refused create's token came back: %v", err)
			}

			a.Concurrency, a.RatePerSec, a.Burst = 10, 1000, 1000
			at = at.Add(time.Second)
			// Soft caps warn; the end user's only count for that user's creates.
			if err := rdb.Set(ctx, k.EndUserCapFlag("eu_1", "soft", "202612"), 1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if out, err := s.Admit(ctx, newPending(p, "eu_2"), a); err != nil || out.SoftCapped {
				t.Fatalf("another user's soft cap: %+v, %v", out, err)
			}
			if out, err := s.Admit(ctx, newPending(p, "eu_1"), a); err != nil || !out.SoftCapped || out.Active != 3 {
				t.Fatalf("the user's soft cap: %+v, %v", out, err)
			}
			// Hard caps refuse: the user's for that user, the project's for all, first.
			if err := rdb.Set(ctx, k.EndUserCapFlag("eu_1", "hard", "202612"), 1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			var se *SpendCapError
			if _, err := s.Admit(ctx, newPending(p, "eu_1"), a); !errors.As(err, &se) || se.Scope != "end_user" {
				t.Fatalf("the user's hard cap: %v", err)
			}
			if _, err := s.Admit(ctx, newPending(p, ""), a); err != nil {
				t.Fatalf("no user, the user's cap: %v", err)
			}
			if err := rdb.Set(ctx, k.CapFlag("hard", "202612"), 1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Admit(ctx, newPending(p, "eu_1"), a); !errors.As(err, &se) || se.Scope != "project" {
				t.Fatalf("the project's hard cap: %v", err)
			}
			if _, err := check("", a); !errors.As(err, &se) || se.Scope != "project" {
				t.Fatalf("check, the project's hard cap: %v", err)
			}
			// Another month's flags do not count.
			next := a
			next.CapMonth = "202701"
			chk, err := check("eu_1", next)
			if err != nil || chk.SoftCapped || chk.Active != 5 {
				t.Fatalf("next month: %+v, %v", chk, err)
			}
			// Refused creates wrote nothing: five sessions, each indexed and with its event.
			if n, _ := s.ActiveCount(ctx, p); n != 5 {
				t.Fatalf("%d slots held, want 5", n)
			}
			if n, _ := rdb.ZCard(ctx, k.all()).Result(); n != 5 {
				t.Fatalf("%d sessions listed, want 5", n)
			}
			if n, _ := rdb.XLen(ctx, k.Outbox()).Result(); n != 5 {
				t.Fatalf("%d events, want 5", n)
			}
			// Rate 0 takes no token: the store's own Create.
			sess := newPending(p, "")
			if _, err := s.Create(ctx, sess, 100); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Create(ctx, sess, 100); !errors.Is(err, ErrExists) {
				t.Fatalf("the same id again: %v", err)
			}
			got, err := s.Get(ctx, p, sess.ID)
			if err != nil || got.State != session.Pending || fmt.Sprint(got.Metadata) != fmt.Sprint(sess.Metadata) {
				t.Fatalf("get: %+v, %v", got, err)
			}
		})
	}
}

// TestReserve: the admission around a decision (Reserve, then Commit or Release) against
// redis-server, miniredis and a Cluster: the refusals before the decision in Admit's order,
// the slots counted and held, a refused create leaving nothing (no slot, no session, no
// event), and a hold whose gateway never came back given back once it lapses.
func TestReserve(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			ctx := context.Background()
			at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
			s := New(rdb, WithClock(func() time.Time { return at }))
			p := "proj_reserve" + b.Name
			k := ProjectKeys(p)
			withEndpoint(t, s, p)
			a := Admission{RatePerSec: 1, Burst: 2, CapMonth: "202612", Concurrency: 2}
			nothingOf := func(id string, slots, sessions, events int64) {
				t.Helper()
				if n, _ := rdb.SCard(ctx, k.active()).Result(); n != slots {
					t.Errorf("%d slots held, want %d", n, slots)
				}
				if n, _ := rdb.ZCard(ctx, k.all()).Result(); n != sessions {
					t.Errorf("%d sessions listed, want %d", n, sessions)
				}
				if n, _ := rdb.XLen(ctx, k.Outbox()).Result(); n != events {
					t.Errorf("%d events, want %d", n, events)
				}
				if _, err := s.Get(ctx, p, id); !errors.Is(err, ErrNotFound) {
					t.Errorf("%s: %v, want not found", id, err)
				}
			}

			// Held, then committed: the session is written with its event, in its slot.
			one := newPending(p, "eu_1")
			r, err := s.Reserve(ctx, p, one.ID, "eu_1", a)
			if err != nil || !r.Held() || r.Active != 0 || r.Err() != nil {
				t.Fatalf("reserve: %+v, %v", r, err)
			}
			out, err := s.Commit(ctx, r, one)
			if err != nil || out.Session.Version != 1 || out.Active != 0 {
				t.Fatalf("commit: %+v, %v", out, err)
			}
			if got, err := s.Get(ctx, p, one.ID); err != nil || got.State != session.Pending || *got.EndUserID != "eu_1" {
				t.Fatalf("get: %+v, %v", got, err)
			}
			if n, _ := rdb.ZCard(ctx, k.byEndUser("eu_1")).Result(); n != 1 {
				t.Fatalf("%d sessions of eu_1", n)
			}
			// Held, then released (a decision refused it): nothing of it stays.
			two := newPending(p, "")
			if r, err = s.Reserve(ctx, p, two.ID, "", a); err != nil || !r.Held() || r.Active != 1 {
				t.Fatalf("reserve: %+v, %v", r, err)
			}
			if err := s.Release(ctx, r); err != nil {
				t.Fatal(err)
			}
			nothingOf(two.ID, 1, 1, 1)
			if _, err := s.Commit(ctx, r, two); err == nil {
				t.Fatal("a released reservation committed")
			}
			nothingOf(two.ID, 1, 1, 1)
			// The bucket is empty (two tokens taken).
			var re *RateLimitError
			if _, err := s.Reserve(ctx, p, "sess_x", "", a); !errors.As(err, &re) || re.Wait != time.Second {
				t.Fatalf("over the rate: %v", err)
			}
			a.RatePerSec, a.Burst = 100, 100
			at = at.Add(10 * time.Second)
			// The id of a session: no slot held, ErrExists after the decision.
			if r, err = s.Reserve(ctx, p, one.ID, "", a); err != nil || r.Held() || !errors.Is(r.Err(), ErrExists) || r.Active != 1 {
				t.Fatalf("reserve an existing id: %+v, %v", r, err)
			}
			// The last slot held by a create whose gateway never comes back: the next is FULL.
			lost := newPending(p, "")
			if r, err = s.Reserve(ctx, p, lost.ID, "", a); err != nil || !r.Held() {
				t.Fatalf("reserve: %+v, %v", r, err)
			}
			var ce *ConcurrencyError
			if r, err = s.Reserve(ctx, p, "sess_y", "", a); err != nil || r.Held() || !errors.As(r.Err(), &ce) || ce.Used != 2 || ce.Limit != 2 {
				t.Fatalf("reserve past the concurrency: %+v, %v", r, err)
			}
			// Once the hold lapses, the next reservation gives its slot back; its late commit fails.
			at = at.Add(ReservationLapse + time.Second)
			three := newPending(p, "")
			if r, err = s.Reserve(ctx, p, three.ID, "", a); err != nil || !r.Held() || r.Active != 1 {
				t.Fatalf("reserve after a lapse: %+v, %v", r, err)
			}
			lr := Reservation{Project: p, ID: lost.ID, status: "HELD"}
			if _, err := s.Commit(ctx, lr, lost); err == nil {
				t.Fatal("a lapsed reservation committed")
			}
			nothingOf(lost.ID, 2, 1, 1)
			if _, err := s.Commit(ctx, r, three); err != nil {
				t.Fatal(err)
			}
			// Caps refuse before any slot is held; the soft one is told.
			at = at.Add(10 * time.Second)
			if err := rdb.Set(ctx, k.CapFlag("soft", "202612"), 1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			a.Concurrency = 10
			if r, err = s.Reserve(ctx, p, "sess_soft", "", a); err != nil || !r.SoftCapped || r.Active != 2 {
				t.Fatalf("soft cap: %+v, %v", r, err)
			}
			if err := s.Release(ctx, r); err != nil {
				t.Fatal(err)
			}
			if err := rdb.Set(ctx, k.EndUserCapFlag("eu_1", "hard", "202612"), 1, 0).Err(); err != nil {
				t.Fatal(err)
			}
			var se *SpendCapError
			if _, err := s.Reserve(ctx, p, "sess_z", "eu_1", a); !errors.As(err, &se) || se.Scope != "end_user" {
				t.Fatalf("the user's hard cap: %v", err)
			}
			nothingOf("sess_z", 2, 2, 2)
			if n, _ := rdb.ZCard(ctx, k.reservations()).Result(); n != 0 {
				t.Fatalf("%d reservations left", n)
			}
		})
	}
}

// TestReserveConcurrent: creates reserving, deciding and committing or releasing at once
// never hold more slots than the limit, and every slot left is a written session's.
func TestReserveConcurrent(t *testing.T) {
	t.Parallel()
	rdb := redistest.Server(t)
	ctx := context.Background()
	s := New(rdb)
	const p, limit, creates = "proj_reserve_race", 5, 64
	withEndpoint(t, s, p)
	a := Admission{RatePerSec: 1000, Burst: 1000, Concurrency: limit}
	var mu sync.Mutex
	held, most, written := 0, 0, 0
	var wg sync.WaitGroup
	for i := range creates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess := newPending(p, "")
			sess.ID = fmt.Sprintf("sess_race%03d", i)
			r, err := s.Reserve(ctx, p, sess.ID, "", a)
			if err != nil {
				t.Error(err)
				return
			}
			if !r.Held() {
				return
			}
			mu.Lock()
			held++
			most = max(most, held+written)
			mu.Unlock()
			// Counted from after the hold began to before it ends (or becomes the
			// session's), so never more here than in the store.
			mu.Lock()
			held--
			if i%3 != 0 {
				written++
			}
			mu.Unlock()
			if i%3 == 0 { // refused by its decision
				err = s.Release(ctx, r)
			} else {
				_, err = s.Commit(ctx, r, sess)
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	k := ProjectKeys(p)
	if most > limit || written > limit || written == 0 {
		t.Fatalf("%d slots held at once and %d written, limit %d", most, written, limit)
	}
	if n, _ := rdb.SCard(ctx, k.active()).Result(); n != int64(written) {
		t.Fatalf("%d slots held, %d sessions written", n, written)
	}
	if n, _ := rdb.ZCard(ctx, k.all()).Result(); n != int64(written) {
		t.Fatalf("%d sessions listed, %d written", n, written)
	}
	if n, _ := rdb.XLen(ctx, k.Outbox()).Result(); n != int64(written) {
		t.Fatalf("%d events, %d written", n, written)
	}
	if n, _ := rdb.ZCard(ctx, k.reservations()).Result(); n != 0 {
		t.Fatalf("%d reservations left", n)
	}
}

// TestCommitAfterScriptFlush: Commit's pipelined EVALSHA relies on Reserve having loaded the
// script; when Redis lost it in between (a restart, SCRIPT FLUSH) the write is made anyway.
func TestCommitAfterScriptFlush(t *testing.T) {
	t.Parallel()
	rdb := redistest.Server(t)
	ctx := context.Background()
	s := New(rdb)
	p := "proj_flush"
	sess := newPending(p, "")
	r, err := s.Reserve(ctx, p, sess.ID, "", Admission{RatePerSec: 10, Burst: 10, Concurrency: 2})
	if err != nil || !r.Held() {
		t.Fatalf("reserve: %+v, %v", r, err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, r, sess); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, p, sess.ID); err != nil || got.State != session.Pending {
		t.Fatalf("get: %+v, %v", got, err)
	}
}

// TestCreateSignals: each way of creating (Admit, Reserve then Commit) signals the project's
// pending and outbox work and indexes the provisioning deadline, and a refused create does
// none of it; on one Redis all of it in the create's one round trip, on a Cluster (where
// those keys are in other slots) in one more.
func TestCreateSignals(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			s, rt, want := countedStore(t, b)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p := "proj_sig_" + b.Name
			withEndpoint(t, s, p)
			a := Admission{RatePerSec: 1000, Burst: 1000, Concurrency: 3}
			read := func(w Work) int {
				t.Helper()
				ps := takeSignals(t, ctx, s, w)
				if i := slices.IndexFunc(ps, func(q string) bool { return q != p }); i >= 0 {
					t.Fatalf("%s signal of %q", w, ps[i])
				}
				return len(ps)
			}
			deadlines := func() []SessionRef {
				t.Helper()
				due, _, err := s.DueProvisionDeadlines(ctx, time.Now().Add(time.Hour), 100)
				if err != nil {
					t.Fatal(err)
				}
				return due
			}
			// The scripts load on first use (NOSCRIPT, then EVAL): count from the second create.
			if _, err := s.Admit(ctx, newPending(p, ""), a); err != nil {
				t.Fatal(err)
			}
			before := rt.Load()
			admitted, err := s.Admit(ctx, newPending(p, "eu_1"), a)
			if err != nil {
				t.Fatal(err)
			}
			if n := rt.Load() - before; n != want {
				t.Errorf("Admit took %d round trips, want %d", n, want)
			}
			r, err := s.Reserve(ctx, p, session.NewID("sess_", time.Now()), "", a)
			if err != nil || !r.Held() {
				t.Fatalf("reserve: %+v %v", r, err)
			}
			committed := newPending(p, "")
			committed.ID = r.ID
			before = rt.Load()
			if _, err := s.Commit(ctx, r, committed); err != nil {
				t.Fatal(err)
			}
			if n := rt.Load() - before; n != want {
				t.Errorf("Commit took %d round trips, want %d", n, want)
			}
			if n := read(WorkPending); n != 3 {
				t.Errorf("%d pending signals after 3 creates", n)
			}
			if n := read(WorkOutbox); n != 3 {
				t.Errorf("%d outbox signals after 3 creates", n)
			}
			due := deadlines()
			if len(due) != 3 || !slices.Contains(due, SessionRef{Project: p, ID: admitted.Session.ID}) ||
				!slices.Contains(due, SessionRef{Project: p, ID: committed.ID}) {
				t.Errorf("provisioning deadlines after 3 creates: %v", due)
			}

			// Refused: the slots are full.
			var ce *ConcurrencyError
			if _, err := s.Admit(ctx, newPending(p, ""), a); !errors.As(err, &ce) {
				t.Fatalf("fourth create: %v", err)
			}
			if r, err := s.Reserve(ctx, p, session.NewID("sess_", time.Now()), "", a); err != nil || r.Held() {
				t.Fatalf("fourth reservation: %+v %v", r, err)
			}
			if np, no, nd := read(WorkPending), read(WorkOutbox), len(deadlines()); np+no != 0 || nd != 3 {
				t.Errorf("refused creates left %d pending and %d outbox signals, and %d deadlines (want 3)", np, no, nd)
			}

			// A project with no webhook endpoint: both ways of a create write the session and
			// signal its placement, and write no event (where the script signals, signal no
			// outbox work either; on a Cluster the caller's signal after finds nothing new).
			quiet := "proj_sig_quiet_" + b.Name
			if _, err := s.Admit(ctx, newPending(quiet, ""), a); err != nil {
				t.Fatal(err)
			}
			if r, err = s.Reserve(ctx, quiet, session.NewID("sess_", time.Now()), "", a); err != nil || !r.Held() {
				t.Fatalf("reserve: %+v %v", r, err)
			}
			committed = newPending(quiet, "")
			committed.ID = r.ID
			if _, err := s.Commit(ctx, r, committed); err != nil {
				t.Fatal(err)
			}
			if n, err := s.ActiveCount(ctx, quiet); err != nil || n != 2 {
				t.Errorf("%d slots held after 2 creates (%v)", n, err)
			}
			if ps := takeSignals(t, ctx, s, WorkPending); len(ps) != 2 {
				t.Errorf("pending signals after 2 creates: %v", ps)
			}
			if ps := takeSignals(t, ctx, s, WorkOutbox); want == 1 && len(ps) != 0 {
				t.Errorf("outbox signals after 2 creates in a project with no webhook endpoint: %v; want none", ps)
			}
			if evs, err := s.OutboxEvents(ctx, quiet); err != nil || len(evs) != 0 {
				t.Errorf("the outbox of a project with no webhook endpoint after 2 creates: %+v, %v; want empty", evs, err)
			}
		})
	}
}

// TestAdmitCapFlags: every combination of the four spend-cap flags (the project's and the
// end user's, hard and soft), against a create with and without that end user, through
// Admit and Reserve: a hard cap refuses (the project's first), else a soft one warns, and
// the end user's count only for that user's creates.
func TestAdmitCapFlags(t *testing.T) {
	t.Parallel()
	rdb := redistest.Server(t)
	ctx := context.Background()
	s := New(rdb)
	for mask := range 16 {
		p := fmt.Sprintf("proj_capflags%d", mask)
		k := ProjectKeys(p)
		flags := []string{k.CapFlag("hard", "202612"), k.CapFlag("soft", "202612"),
			k.EndUserCapFlag("eu_1", "hard", "202612"), k.EndUserCapFlag("eu_1", "soft", "202612")}
		for i, f := range flags {
			if mask&(1<<i) != 0 {
				if err := rdb.Set(ctx, f, 1, 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		a := Admission{CapMonth: "202612", Concurrency: 100}
		for _, eu := range []string{"", "eu_1"} {
			projHard, projSoft := mask&1 != 0, mask&2 != 0
			userHard, userSoft := eu != "" && mask&4 != 0, eu != "" && mask&8 != 0
			wantScope := ""
			switch {
			case projHard:
				wantScope = "project"
			case userHard:
				wantScope = "end_user"
			}
			wantSoft := wantScope == "" && (projSoft || userSoft)
			out, err := s.Admit(ctx, newPending(p, eu), a)
			var se *SpendCapError
			switch {
			case wantScope != "" && (!errors.As(err, &se) || se.Scope != wantScope):
				t.Errorf("flags %04b, end user %q: Admit %+v, %v; want capped %s", mask, eu, out, err, wantScope)
			case wantScope == "" && (err != nil || out.SoftCapped != wantSoft):
				t.Errorf("flags %04b, end user %q: Admit %+v, %v; want soft capped %v", mask, eu, out, err, wantSoft)
			}
			r, err := s.Reserve(ctx, p, session.NewID("sess_", time.Now()), eu, a)
			switch {
			case wantScope != "" && (!errors.As(err, &se) || se.Scope != wantScope):
				t.Errorf("flags %04b, end user %q: Reserve %+v, %v; want capped %s", mask, eu, r, err, wantScope)
			case wantScope == "" && (err != nil || r.SoftCapped != wantSoft):
				t.Errorf("flags %04b, end user %q: Reserve %+v, %v; want soft capped %v", mask, eu, r, err, wantSoft)
			}
		}
	}
}

// TestUnsureReservation: a Reserve that fails is Unsure (an attempt may have run with its
// answer lost; go-redis answers the last attempt's error), and the Release of one that held
// nothing frees nothing: a slot held under another id stays held.
func TestUnsureReservation(t *testing.T) {
	away := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond}))
	r, err := away.Reserve(context.Background(), "proj_unsure", "sess_unsure", "", Admission{RatePerSec: 10, Burst: 10, Concurrency: 5})
	if err == nil || !r.Unsure() || r.Held() {
		t.Fatalf("a Reserve with Redis away: unsure %v, held %v, err %v; want an Unsure reservation and an error", r.Unsure(), r.Held(), err)
	}
	s := New(redistest.Server(t))
	ctx := context.Background()
	held, err := s.Reserve(ctx, "proj_unsure", "sess_held", "", Admission{RatePerSec: 10, Burst: 10, Concurrency: 5})
	if err != nil || !held.Held() {
		t.Fatalf("reserve: %+v, %v", held, err)
	}
	if err := s.Release(ctx, r); err != nil {
		t.Fatalf("release of an unsure reservation that held nothing: %v", err)
	}
	if n, err := s.ActiveCount(ctx, "proj_unsure"); err != nil || n != 1 {
		t.Fatalf("after it, the project holds %d slots (%v), want 1 (sess_held's)", n, err)
	}
}

// TestSentAgain: a write that go-redis sends again after its answer was lost finds its own
// work, whatever the rate bucket holds: Admit answers ErrExists, not a rate refusal, and a
// Reserve held under the id answers it held, taking no second token. (The gateway answers
// the session it finds, and a slot refused for the rate would have been left held.)
func TestSentAgain(t *testing.T) {
	s := New(redistest.Server(t))
	ctx := context.Background()
	const p = "proj_sentagain"
	at := time.Now()
	a := Admission{RatePerSec: 1, Burst: 1, Concurrency: 5, At: at}
	sess := newPending(p, "")
	if _, err := s.Admit(ctx, sess, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, sess, a); !errors.Is(err, ErrExists) {
		t.Fatalf("the same write again, its bucket empty: %v, want ErrExists", err)
	}
	a.At = at.Add(time.Second) // one token back
	for i := range 2 {
		r, err := s.Reserve(ctx, p, "sess_sentagain", "", a)
		if err != nil || !r.Held() || r.Active != 1 {
			t.Fatalf("reserve %d, its bucket empty after the first: %+v, %v; want it held, 1 slot before it", i+1, r, err)
		}
	}
	if n, err := s.ActiveCount(ctx, p); err != nil || n != 2 {
		t.Fatalf("the project holds %d slots (%v), want 2: the session's and the reservation's", n, err)
	}
}

// TestSignalCreated: a create whose answer was lost, its write refused as existing when sent
// again, gets the signals its answer's caller would have made: on a Cluster (where the
// script cannot make them) the placer's signal and the provisioning deadline; on one Redis,
// whose script made them, nothing more.
func TestSignalCreated(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			s := New(rdb)
			ctx := context.Background()
			before, err := rdb.XLen(ctx, signalKey(WorkPending)).Result()
			if err != nil {
				t.Fatal(err)
			}
			sess := newPending("proj_signalcreated"+b.Name, "")
			s.SignalCreated(ctx, sess)
			after, err := rdb.XLen(ctx, signalKey(WorkPending)).Result()
			if err != nil {
				t.Fatal(err)
			}
			want := int64(0)
			if !s.oneRedis {
				want = 1
			}
			if after-before != want {
				t.Errorf("pending signals made: %d, want %d", after-before, want)
			}
			_, err = rdb.ZScore(ctx, provisionDeadlinesKey, SessionRef{Project: sess.ProjectID, ID: sess.ID}.member()).Result()
			if scheduled := err == nil; scheduled != !s.oneRedis {
				t.Errorf("provisioning deadline scheduled: %v (%v), want %v", scheduled, err, !s.oneRedis)
			}
		})
	}
}

// TestReleaseSparesTheRetry: a retry that shares a create's slot (an Idempotency-Key taken
// over while the first request still runs) holds it from then on: the first request's
// release, refused or late, leaves it, and the retry's commit writes the session. Before, the
// release freed the slot and the retry's commit failed as lapsed. A slot no retry took over
// is given back by its own request's release.
func TestReleaseSparesTheRetry(t *testing.T) {
	s := New(redistest.Server(t))
	ctx := context.Background()
	const p = "proj_sparesretry"
	a := Admission{RatePerSec: 100, Burst: 100, Concurrency: 5}
	first, err := s.Reserve(ctx, p, "sess_keyed", "", a)
	if err != nil || !first.Held() {
		t.Fatalf("reserve: %+v, %v", first, err)
	}
	retry, err := s.Reserve(ctx, p, "sess_keyed", "", a)
	if err != nil || !retry.Held() {
		t.Fatalf("the retry's reserve: %+v, %v", retry, err)
	}
	if err := s.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	sess := newPending(p, "")
	sess.ID = "sess_keyed"
	if _, err := s.Commit(ctx, retry, sess); err != nil {
		t.Fatalf("the retry's commit after the first request's release: %v", err)
	}
	if err := s.Release(ctx, first); err != nil { // late, once more
		t.Fatal(err)
	}
	if n, err := s.ActiveCount(ctx, p); err != nil || n != 1 {
		t.Fatalf("the project holds %d slots (%v), want 1: the session's", n, err)
	}
	lone, err := s.Reserve(ctx, p, "sess_lone", "", a)
	if err != nil || !lone.Held() {
		t.Fatalf("reserve: %+v, %v", lone, err)
	}
	if err := s.Release(ctx, lone); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ActiveCount(ctx, p); err != nil || n != 1 {
		t.Fatalf("after a lone reservation's release the project holds %d slots (%v), want 1", n, err)
	}
	k := ProjectKeys(p)
	if n, err := s.rdb.ZCard(ctx, k.reservations()).Result(); err != nil || n != 0 {
		t.Errorf("%d reservations left (%v), want none", n, err)
	}
	if n, err := s.rdb.HLen(ctx, k.reservationHolders()).Result(); err != nil || n != 0 {
		t.Errorf("%d reservation holders left (%v), want none", n, err)
	}
}

// TestReleaseOfAWrittenSession: a release under an id whose session was written another way
// (in one step, the project's decision having changed between two requests of one key)
// leaves the session's slot, and takes the id out of the reservations: left there, it lapsed,
// and the lapse took the session's own slot.
func TestReleaseOfAWrittenSession(t *testing.T) {
	at := time.Now()
	s := New(redistest.Server(t), WithClock(func() time.Time { return at }))
	ctx := context.Background()
	const p = "proj_releasewritten"
	a := Admission{RatePerSec: 100, Burst: 100, Concurrency: 5}
	r, err := s.Reserve(ctx, p, "sess_written", "", a)
	if err != nil || !r.Held() {
		t.Fatalf("reserve: %+v, %v", r, err)
	}
	sess := newPending(p, "")
	sess.ID = "sess_written"
	if _, err := s.Admit(ctx, sess, a); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	at = at.Add(2 * ReservationLapse)
	if _, err := s.Reserve(ctx, p, "sess_later", "", a); err != nil { // its lapse loop runs
		t.Fatal(err)
	}
	if ok, err := s.rdb.SIsMember(ctx, ProjectKeys(p).active(), "sess_written").Result(); err != nil || !ok {
		t.Fatalf("after the lapse the session holds its slot: %v (%v), want true", ok, err)
	}
}
