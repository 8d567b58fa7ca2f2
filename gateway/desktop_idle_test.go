package gateway

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"wb/desktop"
	"wb/store"
)

// TestDesktopUseReachesItsSession: a use of a desktop (a touch: the console's heartbeat, a
// file) reaches its session's node and its last activity, so that the session's own idle
// timer never ends a desktop in use.
func TestDesktopUseReachesItsSession(t *testing.T) {
	e := newEnv(t)
	d := e.newDesktop(map[string]any{"name": "d"})
	before := e.sessionOf(d.SessionID).LastActivityAt
	time.Sleep(20 * time.Millisecond) // activity times are in ms
	if err := e.gw.TouchDesktop(context.Background(), e.projA, d.ID); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(e.node.Calls(), "touch:"+d.SessionID) {
		t.Errorf("the node was not told of the use: calls %v", e.node.Calls())
	}
	after := e.sessionOf(d.SessionID).LastActivityAt
	if after == nil || (before != nil && !after.After(before.Time)) {
		t.Errorf("the session's last activity went from %v to %v", before, after)
	}
}

// TestDesktopUsedBetweenIdleReadAndSleep: a use that comes after the idle loop found a desktop
// idle, but before its sleep is written (a tool call beginning just then), keeps it awake:
// the sleep is refused, and the idle loop leaves it running. The loop's finding is played by
// a move to sleep (and the loop's clock set past the idle time); the use by a touch just
// before it.
func TestDesktopUsedBetweenIdleReadAndSleep(t *testing.T) {
	const idle = time.Hour // the loop never finds it idle by itself
	e := newEnv(t, func(c *Config) { c.DesktopIdle = idle })
	ctx := context.Background()
	d := e.newDesktop(map[string]any{"name": "d"})
	p, err := e.st.GetProject(ctx, e.projA)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.gw.TouchDesktop(ctx, e.projA, d.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.gw.moveDesktop(ctx, p, d.ID, desktop.Idle)
	var used *store.DesktopUsedError
	if !errors.As(err, &used) || time.Since(used.At) > time.Minute {
		t.Fatalf("an idle sleep right after a use: %v, want a DesktopUsedError naming that use", err)
	}
	if got := e.desktop(d.ID); got.State != desktop.Running {
		t.Fatalf("used, yet %s", got.State)
	}
	// The idle loop, on that refusal, sets the deadline from the use.
	e.gw.idleDesktop(ctx, store.DesktopRef{Project: e.projA, ID: d.ID}, time.Now().Add(2*idle))
	if got := e.desktop(d.ID); got.State != desktop.Running {
		t.Fatalf("the idle loop put a desktop used just now to sleep: %s", got.State)
	}
	// A bound after the last use lets the write through.
	rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.PutDesktopIfUnused(ctx, rec, rec.State, time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("a put bounded after the last use: %v", err)
	}
}
