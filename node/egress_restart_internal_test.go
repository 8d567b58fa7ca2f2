package node

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"wb/internal/netguard"
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

// allowingRuntime allows every guest event.
type allowingRuntime struct{}

func (allowingRuntime) Check(context.Context, RuntimeSession, session.GuestEvent) (Verdict, error) {
	return Verdict{AllowEgress: true}, nil
}

// TestEgressRestartKeepsItsLookupPace is the attack on the pace of a guest's name lookups: a
// guest that has spent its burst has its proxy replaced (a memory snapshot, which its tenant
// asks for, restores the guest and starts its proxy again), and the new proxy must not give
// it a fresh burst, or each snapshot is another 256 lookups at once.
func TestEgressRestartKeepsItsLookupPace(t *testing.T) {
	res := &stubResolver{}
	guard, err := netguard.New(netguard.Options{Resolver: res, Dialer: noDialer{t}})
	if err != nil {
		t.Fatal(err)
	}
	n := idleNode(t, Config{Store: store.New(redistest.Server(t)), Driver: lifecycle{stopped: make(chan string, 4)},
		Egress: guard, Runtime: allowingRuntime{}})
	l := &live{g: &guest{GuestID: "g-pace", SessionID: "sess_pace", Project: "proj_pace", State: session.Running}}
	if err := os.MkdirAll(filepath.Join(n.guestDir("g-pace"), "agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	connect := func(i int) {
		t.Helper()
		rec := httptest.NewRecorder()
		l.egress.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodConnect, fmt.Sprintf("n%d.test:443", i), nil))
		if rec.Code != http.StatusBadGateway {
			t.Fatalf("CONNECT n%d.test:443: %d %q; want 502 (no such host)", i, rec.Code, rec.Body.String())
		}
	}
	l.mu.Lock()
	n.startEgress(l)
	l.mu.Unlock()
	t.Cleanup(l.stopEgress)
	start := time.Now()
	for i := range egressLookupBurst {
		connect(i)
	}
	l.mu.Lock()
	n.startEgress(l) // as a memory snapshot's restore does
	l.mu.Unlock()
	const after = 128
	for i := range after {
		connect(egressLookupBurst + i)
	}
	elapsed := time.Since(start)
	if most := egressLookupBurst + int64(egressLookupRate*elapsed.Seconds()) + 8; int64(res.lookups.Load()) > most {
		t.Errorf("%d CONNECTs to new names, %d of them after the proxy was started again, in %s made %d lookups; want at most %d (%d at once, %d a second, across the restart)",
			egressLookupBurst+after, after, elapsed.Round(time.Millisecond), res.lookups.Load(), most, egressLookupBurst, egressLookupRate)
	}
}
