package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"wb/session"
)

// testStartsAnnounced: a session that leaves pending and provisioning (it runs, or ends
// first) is announced on StartsChannel, by the transition's own script, to a subscriber on
// any node of a Cluster too; its placement (pending → provisioning) is not. A message that
// names no session is dropped.
func testStartsAnnounced(t *testing.T, s *Store, project string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	live := make(chan bool, 16)
	got := make(chan SessionRef, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.WatchStarts(ctx, nil, StartWatch{
			Started: func(r SessionRef) {
				if r.Project == project || strings.HasPrefix(r.Project, "junk") {
					got <- r
				}
			},
			Live: func(l bool) { live <- l },
		})
	}()
	defer func() { cancel(); <-done }()
	select {
	case l := <-live:
		if !l {
			t.Fatal("the subscription failed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the subscription did not hold in 10 s")
	}
	next := func(what string) SessionRef {
		t.Helper()
		select {
		case r := <-got:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not announced in 10 s", what)
		}
		return SessionRef{}
	}
	a := mustCreate(t, s, newPending(project, ""), 10)
	b := mustCreate(t, s, newPending(project, ""), 10)
	for _, id := range []string{a.ID, b.ID} {
		step(t, s, Change{Project: project, ID: id, From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "node_1"})
	}
	step(t, s, Change{Project: project, ID: a.ID, From: session.Provisioning, To: session.Running, Driver: session.Node})
	if r := next("a session that runs"); r != (SessionRef{project, a.ID}) {
		t.Fatalf("announced %v, want %s (placements are not announced)", r, a.ID)
	}
	step(t, s, Change{Project: project, ID: b.ID, From: session.Provisioning, To: session.Failed, Driver: session.Node, Reason: session.StartFailure})
	if r := next("a session that failed to start"); r != (SessionRef{project, b.ID}) {
		t.Fatalf("announced %v, want %s", r, b.ID)
	}
	// Nor is a session's later life (running → stopping → stopped).
	step(t, s, Change{Project: project, ID: a.ID, From: session.Running, To: session.Stopping, Driver: session.Caller, Reason: session.Deleted})
	step(t, s, Change{Project: project, ID: a.ID, From: session.Stopping, To: session.Stopped, Driver: session.Node, Reason: session.Deleted})
	for _, junk := range []string{"", "/", "junkp/", "/sess_x", "junkp", "junkp/" + strings.Repeat("x", maxStartMessage)} {
		if err := s.rdb.Publish(ctx, StartsChannel, junk).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.rdb.Publish(ctx, StartsChannel, "junkp/sess_last").Err(); err != nil {
		t.Fatal(err)
	}
	if r := next("a well-formed message"); r != (SessionRef{"junkp", "sess_last"}) {
		t.Fatalf("announced %v, want junkp/sess_last alone after the session's start (the rest of its life, and messages that name no session, dropped)", r)
	}
}
