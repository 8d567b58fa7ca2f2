package placer

import (
	"context"
	"slices"
	"testing"
	"time"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// BenchmarkPlaceOne: one pending session placed per round, one round at a time, on a real
// redis-server: a placement's share of every create's latency. Beside it, in the same
// result line, a PING on the same client (ping-p50-µs, ping-p99-µs) and the round trips a
// placement makes (round-trips/op).
func BenchmarkPlaceOne(b *testing.B) {
	rdb := redistest.Server(b)
	rt := redistest.CountRoundTrips(rdb)
	st, rec, p, now := setupOn(b, rdb)
	ctx := context.Background()
	nodes, err := st.Nodes(ctx)
	if err != nil {
		b.Fatal(err)
	}
	i := slices.IndexFunc(nodes, func(n store.NodeInfo) bool { return n.ID == "n_other" })
	if i < 0 {
		b.Fatal("no node n_other")
	}
	other := nodes[i]
	var place, ping []time.Duration
	trips := int64(0)
	for i := range b.N + 1 { // the first round loads the scripts: not counted
		b.StopTimer()
		*now = time.Now()
		// The node heartbeats, as a live one does: a run longer than the heartbeat
		// timeout (5 s) must not find it dead.
		if err := st.Heartbeat(ctx, other); err != nil {
			b.Fatal(err)
		}
		s := pending(b, st, "proj_a", "r2", 2, 256)
		t0 := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		ping = append(ping, time.Since(t0))
		before := rt.Load()
		b.StartTimer()
		t0 = time.Now()
		p.PlaceProject(ctx, "proj_a")
		el := time.Since(t0)
		b.StopTimer()
		p.wg.Wait()
		if rec.nodeOf(s.ID) == "" {
			b.Fatalf("%s not placed", s.ID)
		}
		if i > 0 {
			place = append(place, el)
			trips += rt.Load() - before
		}
		// It ends, and its claim goes: the node's room and the project's share stay free.
		if _, err := st.Transition(ctx, store.Change{Project: "proj_a", ID: s.ID, From: session.Provisioning, To: session.Failed,
			Driver: session.Node, Reason: session.StartFailure}); err != nil {
			b.Fatal(err)
		}
		if err := st.ReleaseOnNode(ctx, "n_other", store.Claim{Session: s.ID, VCPU: s.Resources.VCPU, MemoryMiB: s.Resources.MemoryMiB}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(pct(place, 0.5), "p50-µs")
	b.ReportMetric(pct(place, 0.99), "p99-µs")
	b.ReportMetric(pct(ping, 0.5), "ping-p50-µs")
	b.ReportMetric(pct(ping, 0.99), "ping-p99-µs")
	b.ReportMetric(float64(trips)/float64(b.N), "round-trips/op")
}

func pct(d []time.Duration, p float64) float64 {
	d = slices.Clone(d)
	slices.Sort(d)
	return float64(d[int(float64(len(d)-1)*p)].Nanoseconds()) / 1e3
}
