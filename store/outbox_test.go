package store

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// TestOutboxBounded: every writer of the outbox trims it to about outboxMaxLen entries, so
// an outbox that nobody reads (a project with no endpoint, a dispatcher down) stays bounded.
func TestOutboxBounded(t *testing.T) {
	t.Parallel()
	if strconv.Itoa(outboxMaxLen) != outboxMaxLenLua {
		t.Fatalf("outboxMaxLen %d, the scripts' %s", outboxMaxLen, outboxMaxLenLua)
	}
	rdb := redistest.Server(t)
	s := New(rdb)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const project = "proj_big"
	withEndpoint(t, s, project)
	stream := Outbox(project)
	// Approximate trimming removes whole stream nodes (100 entries by default): an outbox
	// this far over the bound must lose at least one.
	const over = outboxMaxLen + 500
	fill := func() {
		t.Helper()
		n, err := rdb.XLen(ctx, stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		for n < over {
			batch := min(over-n, 10_000)
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for range batch {
					p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"type", "filler"}})
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			n += batch
		}
	}
	check := func(writer string) {
		t.Helper()
		n, err := rdb.XLen(ctx, stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n >= over {
			t.Errorf("%s left the outbox at %d entries, bound %d", writer, n, outboxMaxLen)
		}
	}

	fill()
	sess, err := s.Create(ctx, newPending(project, ""), 10)
	if err != nil {
		t.Fatal(err)
	}
	check("Create")
	fill()
	sess.IdleTimeoutS = 60
	if sess, err = s.SetTimers(ctx, sess); err != nil {
		t.Fatal(err)
	}
	check("SetTimers")
	fill()
	if err := s.MarkWarning(ctx, project, sess.ID, session.EventIdleWarning, time.Now()); err != nil {
		t.Fatal(err)
	}
	check("MarkWarning")
	fill()
	if _, err := s.AppendEvent(ctx, project, session.EventSnapshotReady, sess.ID, map[string]string{"id": "snap_1"}); err != nil {
		t.Fatal(err)
	}
	check("AppendEvent")
	fill()
	if _, err := s.Transition(ctx, Change{Project: project, ID: sess.ID, From: session.Pending, To: session.Failed,
		Driver: session.Timer, Reason: session.ProvisionTimeout, Version: sess.Version}); err != nil {
		t.Fatal(err)
	}
	check("Transition")
}
