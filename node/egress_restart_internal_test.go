package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/quota"
	"wb/session"
	"wb/store"
)

// TestEgressRestartKeepsItsCount: a guest's egress proxy is replaced when the guest is (a
// memory snapshot's restore): the bytes the old one counted since the last usage sample are
// the new one's to report, where they were lost (a review found seconds of uploads going
// unbilled at each snapshot).
func TestEgressRestartKeepsItsCount(t *testing.T) {
	dir, err := os.MkdirTemp("", "wb-egress-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n := &Node{Config: Config{Logger: slog.New(slog.DiscardHandler), DataDir: dir}}
	l := &live{g: &guest{GuestID: "g-1", SessionID: "sess_1", State: session.Running}}
	if err := os.MkdirAll(filepath.Join(n.guestDir("g-1"), "agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	n.startEgress(l)
	if l.egress == nil {
		t.Fatal("no egress proxy")
	}
	t.Cleanup(l.stopEgress)
	l.egress.bytes.Add(1234) // counted after the last sample
	n.startEgress(l)
	if got := l.egress.bytes.Load(); got != 1234 {
		t.Errorf("the new proxy reports %d bytes, want the old one's 1234", got)
	}
}

// TestFinalMeterBillsEgressUpToTheStop: the teardown stops the guest's egress proxy before
// its final meter reads the count, so that every byte that went out is billed. Before, the
// meter came first, and bytes the guest sent between it and the proxy's stop went out
// unbilled: here the guest sends them as the teardown cancels the guest's watch, which
// came after the meter and before the stop.
func TestFinalMeterBillsEgressUpToTheStop(t *testing.T) {
	rdb := redistest.Server(t)
	n := idleNode(t, Config{Store: store.New(rdb), Driver: lifecycle{stopped: make(chan string, 4)}})
	upstream, received, _ := sinkUpstream(t, false)
	proxy, p, _, _ := servedEgress(t, loopbackGate(t), nil)
	const project, id = "proj_meter", "sess_meter"
	l := &live{g: &guest{SessionID: id, Project: project, GuestID: "g_meter", State: session.Stopping, Reason: session.IdleTimeout,
		Tier: 2, StartedAt: time.Now().Add(-time.Minute), SampledAt: time.Now().Add(-time.Second), IdleTimeoutS: 600, MaxLifetimeS: 600},
		egress: p}
	n.guests[id] = l
	tunnel := openTunnel(t, proxy, upstream)
	send := func(b int) {
		t.Helper()
		want := received.Load() + int64(b)
		if _, err := tunnel.Write(make([]byte, b)); err != nil {
			return // the proxy stopped: nothing goes out
		}
		for deadline := time.Now().Add(2 * time.Second); received.Load() < want && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	send(1000)
	l.cancel = func() { send(500) } // in kill, between the meter and the proxy's stop, before the fix
	n.teardown(t.Context(), l)

	msgs, err := rdb.XRange(t.Context(), store.ProjectKeys(project).UsageStream(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var billed int64
	for _, m := range msgs {
		r, err := quota.DecodeRecord(m.Values)
		if err != nil {
			t.Fatal(err)
		}
		billed += r.EgressBytes
	}
	if sent := received.Load(); billed != sent {
		t.Errorf("billed %d egress bytes; the upstream received %d", billed, sent)
	}
}
