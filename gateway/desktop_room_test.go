package gateway

import (
	"context"
	"testing"
	"time"

	"wb/desktop"
	"wb/store"
)

// TestDesktopRoomNodeTimeout: the desktop room check (desktopRoom) judges a node alive by the
// gateway's node timeout (--node-timeout), as the placer does, not by a fixed 10 s. The one
// node with room beats late, its heartbeat always lag old (the fake node, live, is full): with
// a node timeout of 30 s it is live for the placer, and a desktop is made and placed on it;
// with one of 5 s it is dead for the placer, and the create is refused with a 409 no_capacity
// rather than left pending until its provisioning deadline.
func TestDesktopRoomNodeTimeout(t *testing.T) {
	for _, tc := range []struct {
		name         string
		timeout, lag time.Duration
		live         bool
	}{
		{"longer", 30 * time.Second, 12 * time.Second, true},
		{"shorter", 5 * time.Second, 7 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.NodeTimeout = tc.timeout })
			ctx := context.Background()
			if err := e.node.SetCapacity(ctx, 0); err != nil {
				t.Fatal(err)
			}
			e.beatLateNode(store.NodeInfo{ID: "node_late", Addr: "127.0.0.1:0", Region: "local", Zone: "local-b",
				Tiers: []int{1, 2, 3, 4}, VCPU: 1000, MemoryMiB: 1 << 31}, tc.lag)
			r := e.do("POST", "/v1/desktops", e.key, map[string]any{"name": "d"})
			if !tc.live {
				expectError(t, r, 409, "no_capacity", "")
				return
			}
			if r.status != 201 {
				t.Fatalf("create: %d %s; want 201 (node_late, %v late, is live with a node timeout of %v)", r.status, r.body, tc.lag, tc.timeout)
			}
			var d desktop.Desktop
			e.mustDo("GET", "/v1/desktops/"+r.json(t)["id"].(string), e.key, nil, 200, &d)
			d = e.waitDesktop(d.ID, desktop.Running)
			if got := e.nodeOf(d.SessionID); got != "node_late" {
				t.Errorf("the desktop runs on %q, want node_late", got)
			}
		})
	}
}

// beatLateNode registers node n and heartbeats it every second until the test ends, each
// heartbeat stamped lag before now (a node whose heartbeats are that late).
func (e *env) beatLateNode(n store.NodeInfo, lag time.Duration) {
	e.t.Helper()
	e.beatWith(store.New(e.rdb, store.WithClock(func() time.Time { return time.Now().Add(-lag) })), n)
}
