package store

import (
	"context"
	"encoding/json"
	"errors"
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
	if err := s.ForgetDesktopIdle(ctx, "proj_i", "desk_b"); err != nil {
		t.Fatal(err)
	}
	due, next, _ = s.DueDesktopIdle(ctx, t0.Add(90*time.Second), 10)
	if len(due) != 0 || !next.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("after a use and a forget: due %v next %v", due, next)
	}
}
