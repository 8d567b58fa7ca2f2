package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
)

// TestAdmit: a create's admission in one script, against redis-server, miniredis and a
// Cluster (every key in the project's slot): each refusal in its order, and nothing written
// but the token a refused create took.
func TestAdmit(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.New(t)
			ctx := context.Background()
			at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
			s := New(rdb, WithClock(func() time.Time { return at }))
			p := "proj_admit" + b.Name
			k := ProjectKeys(p)
			a := Admission{RatePerSec: 1, Burst: 2, CapMonth: "202612", Concurrency: 2}

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
			if _, err := s.CheckAdmission(ctx, p, "", a); !errors.As(err, &re) {
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
			if _, err := s.CheckAdmission(ctx, p, "", a); !errors.As(err, &se) || se.Scope != "project" {
				t.Fatalf("check, the project's hard cap: %v", err)
			}
			// Another month's flags do not count.
			next := a
			next.CapMonth = "202701"
			chk, err := s.CheckAdmission(ctx, p, "eu_1", next)
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
