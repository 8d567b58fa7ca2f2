package gateway

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestDesktopUseReachesItsSession: a use of a desktop (a touch: the console's heartbeat, a
// file) reaches its session's node and its last activity, so that the session's own idle
// timer never ends a desktop in use.
func TestDesktopUseReachesItsSession(t *testing.T) {
	e := newDesktopEnv(t)
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
