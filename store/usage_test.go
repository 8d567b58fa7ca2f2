package store

import (
	"context"
	"testing"

	"wb/internal/redistest"
	"wb/session"
)

func TestAddSessionUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	sess := mustCreate(t, s, newPending("proj_u", ""), 10)
	usage := func() session.Usage {
		t.Helper()
		got, err := s.Get(ctx, "proj_u", sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.UsageToDate
	}
	add := func(runs ...SessionUsage) []int {
		t.Helper()
		straddled, err := s.AddSessionUsage(ctx, "proj_u", runs)
		if err != nil {
			t.Fatal(err)
		}
		return straddled
	}
	run := func(from, to int64) SessionUsage {
		n := to - from + 1
		return SessionUsage{ID: sess.ID, FromSeq: from, ToSeq: to, SessionMs: 1000 * n, CPUMs: 10 * n, MemGiBMs: 5 * n, EgressBytes: n}
	}
	if got := add(run(1, 3)); len(got) != 0 {
		t.Fatalf("straddled %v", got)
	}
	want := session.Usage{SessionS: 3, CPUMs: 30, MemGiBMs: 15, EgressBytes: 3}
	if got := usage(); got != want {
		t.Fatalf("usage %+v, want %+v", got, want)
	}
	// A replay (a settler that crashed before acknowledging) adds nothing.
	add(run(1, 3), run(2, 3))
	if got := usage(); got != want {
		t.Fatalf("after a replay: usage %+v, want %+v", got, want)
	}
	// A run that is part added, part new, is handed back to be added record by record.
	if got := add(run(4, 4), run(3, 6)); len(got) != 1 || got[0] != 1 {
		t.Fatalf("straddled %v, want [1]", got)
	}
	add(run(5, 5), run(6, 6))
	want = session.Usage{SessionS: 6, CPUMs: 60, MemGiBMs: 30, EgressBytes: 6}
	if got := usage(); got != want {
		t.Fatalf("usage %+v, want %+v", got, want)
	}
	// A session that is gone is not recreated by its late usage.
	if got := add(SessionUsage{ID: "sess_gone", FromSeq: 1, ToSeq: 1, SessionMs: 1}); len(got) != 0 {
		t.Fatalf("straddled %v", got)
	}
	if n := s.rdb.Exists(ctx, ProjectKeys("proj_u").session("sess_gone")).Val(); n != 0 {
		t.Fatal("usage recreated a session that is gone")
	}
}

func TestAppendUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	if err := s.AppendUsage(ctx, "proj_a", []any{"session", "sess_1", "seq", 1}); err != nil {
		t.Fatal(err)
	}
	msgs, err := s.rdb.XRange(ctx, ProjectKeys("proj_a").UsageStream(), "-", "+").Result()
	if err != nil || len(msgs) != 1 || msgs[0].Values["session"] != "sess_1" || msgs[0].Values["seq"] != "1" {
		t.Fatalf("usage stream %v %v", msgs, err)
	}
}

func TestOutboxEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	withEndpoint(t, s, "proj_o")
	sess := mustCreate(t, s, newPending("proj_o", ""), 10)
	if _, err := s.AppendEvent(ctx, "proj_o", session.EventQuotaExceeded, "", map[string]any{"object": "quota"}); err != nil {
		t.Fatal(err)
	}
	evs, err := s.OutboxEvents(ctx, "proj_o")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Type != session.EventPending || evs[0].SessionID != sess.ID || evs[1].Type != session.EventQuotaExceeded {
		t.Fatalf("outbox %+v", evs)
	}
	if evs, err := s.OutboxEvents(ctx, "proj_none"); err != nil || len(evs) != 0 {
		t.Fatalf("empty outbox: %v %v", evs, err)
	}
}
