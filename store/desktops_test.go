package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/desktop"
	"wb/internal/redistest"
	"wb/session"
)

// TestDesktops: a desktop's record is written by compare-and-set on its version, every change
// of state appends its event (with the desktop as data.object) to the outbox, a touch marks
// only an awake desktop used, lists page newest first, and a delete appends desktop.deleted.
func TestDesktops(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			s := New(b.New(t))
			now := time.Now()
			rec := desktop.Record{Desktop: desktop.Desktop{ID: session.NewID(desktop.IDPrefix, now), ProjectID: "proj_d",
				Name: "work", Size: "s", State: desktop.Starting, CreatedAt: *session.At(now)}}
			r1, err := s.PutDesktop(ctx, rec, "")
			if err != nil || r1.Version != 1 {
				t.Fatalf("create: %+v %v", r1, err)
			}
			if _, err := s.PutDesktop(ctx, rec, ""); !errors.Is(err, ErrDesktopChanged) {
				t.Fatalf("second create: %v, want ErrDesktopChanged", err)
			}
			r1.State, r1.SessionID = desktop.Running, "sess_1"
			r2, err := s.PutDesktop(ctx, r1, desktop.Starting)
			if err != nil || r2.Version != 2 {
				t.Fatalf("running: %+v %v", r2, err)
			}
			stale := r1 // at version 1
			stale.State = desktop.Stopping
			if _, err := s.PutDesktop(ctx, stale, desktop.Running); !errors.Is(err, ErrDesktopChanged) {
				t.Fatalf("stale write: %v, want ErrDesktopChanged", err)
			}
			r2.Name = "renamed"
			if r2, err = s.PutDesktop(ctx, r2, desktop.Running); err != nil { // no state change: no event
				t.Fatal(err)
			}
			if st, err := s.TouchDesktop(ctx, "proj_d", rec.ID, now.Add(time.Minute)); err != nil || st != desktop.Running {
				t.Fatalf("touch: %s %v", st, err)
			}
			got, err := s.GetDesktop(ctx, "proj_d", rec.ID)
			if err != nil || got.Version != 3 || got.Name != "renamed" || got.SessionID != "sess_1" ||
				got.LastUsedAt == nil || got.LastUsedAt.UnixMilli() != now.Add(time.Minute).UnixMilli() {
				t.Fatalf("get: %+v %v", got, err)
			}
			got.State = desktop.Asleep
			if got, err = s.PutDesktop(ctx, got, desktop.Running); err != nil {
				t.Fatal(err)
			}
			if _, err := s.TouchDesktop(ctx, "proj_d", rec.ID, now.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			if g, _ := s.GetDesktop(ctx, "proj_d", rec.ID); g.LastUsedAt.UnixMilli() != now.Add(time.Minute).UnixMilli() {
				t.Errorf("a touch of an asleep desktop moved its last use to %v", g.LastUsedAt)
			}
			if _, err := s.TouchDesktop(ctx, "proj_d", "desk_none", now); !errors.Is(err, ErrNotFound) {
				t.Errorf("touch of no desktop: %v", err)
			}
			other := rec
			other.ID = session.NewID(desktop.IDPrefix, now.Add(time.Second))
			if _, err := s.PutDesktop(ctx, other, ""); err != nil {
				t.Fatal(err)
			}
			page, next, err := s.ListDesktops(ctx, "proj_d", 1, "")
			if err != nil || len(page) != 1 || page[0].ID != other.ID || next != other.ID {
				t.Fatalf("page 1: %v %q %v", page, next, err)
			}
			page, next, err = s.ListDesktops(ctx, "proj_d", 1, next)
			if err != nil || len(page) != 1 || page[0].ID != rec.ID || next != "" {
				t.Fatalf("page 2: %v %q %v", page, next, err)
			}
			if _, _, err := s.ListDesktops(ctx, "proj_d", 1, "sess_x"); err == nil {
				t.Error("a session cursor was accepted")
			}
			if err := s.SetDesktopIdle(ctx, "proj_d", rec.ID, now); err != nil {
				t.Fatal(err)
			}
			gone, err := s.DeleteDesktop(ctx, "proj_d", rec.ID)
			if err != nil || gone.ID != rec.ID || gone.State != desktop.Asleep {
				t.Fatalf("delete: %+v %v", gone, err)
			}
			if _, err := s.GetDesktop(ctx, "proj_d", rec.ID); !errors.Is(err, ErrNotFound) {
				t.Errorf("get after delete: %v", err)
			}
			if due, _, _ := s.DueDesktopIdle(ctx, now.Add(time.Hour), 10); len(due) != 0 {
				t.Errorf("a deleted desktop is still due: %v", due)
			}
			evs, err := s.OutboxEvents(ctx, "proj_d")
			if err != nil {
				t.Fatal(err)
			}
			var types []string
			for _, ev := range evs {
				if ev.SessionID == rec.ID {
					types = append(types, ev.Type)
					var d desktop.Desktop
					if err := json.Unmarshal(ev.Object, &d); err != nil || d.ID != rec.ID || ev.ProjectID != "proj_d" {
						t.Errorf("event %s: object %s (%v), project %q", ev.Type, ev.Object, err, ev.ProjectID)
					}
				}
			}
			want := []string{"desktop.starting", "desktop.running", "desktop.asleep", "desktop.deleted"}
			if len(types) != len(want) {
				t.Fatalf("events %v, want %v", types, want)
			}
			for i := range want {
				if types[i] != want[i] {
					t.Fatalf("events %v, want %v", types, want)
				}
			}
		})
	}
}

// TestDesktopIdleDeadlines: the due desktops are those whose deadline passed, earliest first,
// with the time of the next one.
func TestDesktopIdleDeadlines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	t0 := time.UnixMilli(1_800_000_000_000)
	for i, id := range []string{"desk_a", "desk_b", "desk_c"} {
		if err := s.SetDesktopIdle(ctx, "proj_i", id, t0.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	due, next, err := s.DueDesktopIdle(ctx, t0.Add(90*time.Second), 10)
	if err != nil || len(due) != 2 || due[0].ID != "desk_a" || due[1].ID != "desk_b" || !next.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("due %v next %v %v", due, next, err)
	}
	if err := s.SetDesktopIdle(ctx, "proj_i", "desk_a", t0.Add(time.Hour)); err != nil { // used again
		t.Fatal(err)
	}
	if err := s.ForgetDesktopIdle(ctx, "proj_i", "desk_b", t0.Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	due, next, _ = s.DueDesktopIdle(ctx, t0.Add(90*time.Second), 10)
	if len(due) != 0 || !next.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("after a use and a forget: due %v next %v", due, next)
	}
	// A forget of a deadline that passed spares a later one set since (a wake's).
	if err := s.ForgetDesktopIdle(ctx, "proj_i", "desk_a", t0.Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	if due, _, _ = s.DueDesktopIdle(ctx, t0.Add(2*time.Hour), 10); len(due) != 2 || due[1].ID != "desk_a" {
		t.Fatalf("a forget of a passed deadline removed a later one: due %v", due)
	}
}

// TestDesktopWorkLeases: a lease is renewed and released only by its holder, claimed only
// once it has run out, and a new work's lease supersedes the old one's.
func TestDesktopWorkLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	t0 := time.UnixMilli(1_800_000_000_000)
	ref := DesktopRef{Project: "proj_w", ID: "desk_w"}
	must := func(ok bool, err error) bool {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if err := s.SetDesktopWork(ctx, ref, "a", t0.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if must(s.ClaimDesktopWork(ctx, ref, "b", t0.Add(10*time.Second), t0.Add(40*time.Second))) {
		t.Fatal("claimed a lease that still runs")
	}
	if must(s.RenewDesktopWork(ctx, ref, "b", t0.Add(time.Hour))) || must(s.ReleaseDesktopWork(ctx, ref, "b")) {
		t.Fatal("a stranger renewed or released the lease")
	}
	if !must(s.RenewDesktopWork(ctx, ref, "a", t0.Add(60*time.Second))) {
		t.Fatal("the holder could not renew")
	}
	if due, next, _ := s.DueDesktopWork(ctx, t0.Add(59*time.Second), 10); len(due) != 0 || !next.Equal(t0.Add(60*time.Second)) {
		t.Fatalf("before the renewed end: due %v next %v", due, next)
	}
	// Its holder died: once the lease ran out, one claimant takes it over.
	if due, _, _ := s.DueDesktopWork(ctx, t0.Add(61*time.Second), 10); len(due) != 1 || due[0] != ref {
		t.Fatalf("after the end: due %v", due)
	}
	if !must(s.ClaimDesktopWork(ctx, ref, "b", t0.Add(61*time.Second), t0.Add(91*time.Second))) {
		t.Fatal("could not claim a lease that ran out")
	}
	if must(s.ClaimDesktopWork(ctx, ref, "c", t0.Add(61*time.Second), t0.Add(91*time.Second))) {
		t.Fatal("a second claimant took the lease too")
	}
	if must(s.RenewDesktopWork(ctx, ref, "a", t0.Add(time.Hour))) {
		t.Fatal("the dead holder renewed the lease it lost")
	}
	// A newer request's work supersedes; the older work's release leaves it alone.
	if err := s.SetDesktopWork(ctx, ref, "d", t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if must(s.ReleaseDesktopWork(ctx, ref, "b")) {
		t.Fatal("superseded work released the newer lease")
	}
	if !must(s.ReleaseDesktopWork(ctx, ref, "d")) {
		t.Fatal("the holder could not release")
	}
	if due, next, _ := s.DueDesktopWork(ctx, t0.Add(time.Hour), 10); len(due) != 0 || !next.IsZero() {
		t.Fatalf("after release: due %v next %v", due, next)
	}
	if must(s.ClaimDesktopWork(ctx, ref, "e", t0.Add(time.Hour), t0.Add(2*time.Hour))) {
		t.Fatal("claimed a released lease")
	}
	// A lease set ahead of a transition is held by nobody: a work's renewal takes it (its own
	// SetDesktopWork failed), and none is set where one runs.
	if !must(s.EnsureDesktopWork(ctx, ref, t0.Add(3*time.Minute))) || must(s.EnsureDesktopWork(ctx, ref, t0.Add(4*time.Minute))) {
		t.Fatal("the lease ahead was not set once, and only once")
	}
	if !must(s.RenewDesktopWork(ctx, ref, "f", t0.Add(5*time.Minute))) || must(s.RenewDesktopWork(ctx, ref, "g", t0.Add(5*time.Minute))) {
		t.Fatal("the lease ahead was not taken by the first work's renewal alone")
	}
	if must(s.EnsureDesktopWork(ctx, ref, t0.Add(time.Minute))) {
		t.Fatal("a lease ahead replaced a held one")
	}
	if due, _, _ := s.DueDesktopWork(ctx, t0.Add(4*time.Minute), 10); len(due) != 0 {
		t.Fatalf("the held lease is due early: %v", due)
	}
}

// TestDesktopCap: CreateDesktop refuses a project's desktop past max with a conflict that
// says what to do, and stores nothing; desktops in any state count (a failed one stays until
// deleted); a delete makes room; creates at once never pass max together.
func TestDesktopCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	const p, max, tries = "proj_cap", 3, 12
	rec := func(i int) desktop.Record {
		now := time.Now()
		return desktop.Record{Desktop: desktop.Desktop{ID: session.NewID(desktop.IDPrefix, now), ProjectID: p,
			Name: fmt.Sprintf("d%d", i), Size: "s", State: desktop.Starting, CreatedAt: *session.At(now)}}
	}
	var wg sync.WaitGroup
	errs := make([]error, tries)
	for i := range tries {
		wg.Go(func() { _, errs[i] = s.CreateDesktop(ctx, rec(i), max) })
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		var ce *ConflictError
		switch {
		case err == nil:
			ok++
		case !errors.As(err, &ce) || !strings.Contains(err.Error(), "3 desktops") || !strings.Contains(err.Error(), "DELETE /v1/desktops/{id}"):
			t.Errorf("a create failed otherwise: %v", err)
		}
	}
	all, _, err := s.ListDesktops(ctx, p, 100, "")
	if err != nil || len(all) != max || ok != max {
		t.Fatalf("%d desktops stored, %d creates answered OK; want %d (%v)", len(all), ok, max, err)
	}
	failed := all[0]
	failed.State = desktop.Failed
	if _, err := s.PutDesktop(ctx, failed, desktop.Starting); err != nil {
		t.Fatal(err)
	}
	var ce *ConflictError
	if _, err := s.CreateDesktop(ctx, rec(99), max); !errors.As(err, &ce) {
		t.Fatalf("past the cap with a failed desktop: %v", err)
	}
	if _, err := s.DeleteDesktop(ctx, p, failed.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateDesktop(ctx, rec(99), max); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
}
