package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/desktop"
	"wb/session"
	"wb/store"
)

// secondGateway starts another gateway on e's Redis and node, as a second replica would be,
// and points e's requests at it.
func (e *env) secondGateway(cfg func(*Config)) *Server {
	e.t.Helper()
	c := e.gw.Config
	c.Metrics = NewMetrics(e.st)
	if cfg != nil {
		cfg(&c)
	}
	gw, url := e.startGateway(c)
	e.url = url
	return gw
}

// startGateway starts a gateway with c behind a test server of its own, both closed with the
// test, and answers it and its URL.
func (e *env) startGateway(c Config) (*Server, string) {
	e.t.Helper()
	gw, err := New(c)
	if err != nil {
		e.t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	gw.PublicURL = srv.URL
	e.t.Cleanup(func() { srv.Close(); gw.Close() })
	return gw, srv.URL
}

// createInSetup creates a desktop and waits for its setup to begin (the setup sends on
// inSetup).
func (e *env) createInSetup(inSetup <-chan struct{}) desktop.Desktop {
	e.t.Helper()
	var d desktop.Desktop
	e.mustDo("POST", "/v1/desktops", e.key, map[string]any{"name": "d"}, 201, &d)
	select {
	case <-inSetup:
	case <-time.After(90 * time.Second):
		e.t.Fatal("the desktop's setup never began")
	}
	return d
}

// TestDesktopStartSurvivesItsGateway: a gateway dies while a desktop starts (its session
// admitted and running, its setup under way); another gateway takes the work over once the
// dead one's lease runs out, and the desktop runs on the session already made, not a second.
func TestDesktopStartSurvivesItsGateway(t *testing.T) {
	inSetup := make(chan struct{}, 1)
	e := newEnv(t, func(c *Config) {
		c.WorkLease = time.Second
		c.DesktopSetup = func(ctx context.Context, _ desktop.Execer) error {
			inSetup <- struct{}{}
			<-ctx.Done() // the gateway dies in the middle of it
			return ctx.Err()
		}
	})
	d := e.createInSetup(inSetup)
	e.gw.Close()
	d = e.desktop(d.ID)
	if d.State != desktop.Starting || d.SessionID == "" {
		t.Fatalf("after its gateway died: %+v", d)
	}
	first := d.SessionID

	setups := make(chan struct{}, 4)
	e.secondGateway(func(c *Config) {
		c.DesktopSetup = func(context.Context, desktop.Execer) error { setups <- struct{}{}; return nil }
	})
	d = e.waitDesktop(d.ID, desktop.Running)
	if d.SessionID != first {
		t.Errorf("resumed on session %s, want the one already made, %s", d.SessionID, first)
	}
	if len(setups) != 1 {
		t.Errorf("the resumed start ran the setup %d times, want once", len(setups))
	}
	var list session.List[session.Session]
	e.mustDo("GET", "/v1/sessions?state=running", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d running sessions, want the desktop's one", len(list.Data))
	}
}

// TestDesktopSleepSurvivesItsGateway: a desktop left in stopping by a gateway that died
// (its lease ran out) is put to sleep by another, with its state saved.
func TestDesktopSleepSurvivesItsGateway(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Second })
	d := e.newDesktop(map[string]any{"name": "d"})
	ctx := context.Background()
	rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	// What a gateway leaves that died right after it accepted a Sleep.
	rec.State, rec.Goal = desktop.Stopping, desktop.Asleep
	if _, err := e.st.PutDesktop(ctx, rec, desktop.Running); err != nil {
		t.Fatal(err)
	}
	ref := store.DesktopRef{Project: e.projA, ID: d.ID}
	if err := e.st.SetDesktopWork(ctx, ref, "lease_of_the_dead", time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	d = e.waitDesktop(d.ID, desktop.Asleep)
	if !d.StateSaved {
		t.Errorf("asleep without its state: %+v", d)
	}
	e.waitState(e.key, rec.SessionID, session.Stopped)
	if due, _, _ := e.st.DueDesktopWork(ctx, time.Now().Add(time.Hour), 10); len(due) != 0 {
		t.Errorf("leases left after the work: %v", due)
	}
}

// TestDesktopSetupExecTimeout: a setup command lasts as long as the setup's context allows
// (not an exec's default), and one that outlasts it fails the start with a message saying so.
func TestDesktopSetupExecTimeout(t *testing.T) {
	type result struct {
		err     error
		elapsed time.Duration
	}
	got := make(chan result, 1)
	e := newEnv(t, func(c *Config) {
		c.DesktopSetup = func(ctx context.Context, ex desktop.Execer) error {
			ctx, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			start := time.Now()
			_, _, _, err := ex.Exec(ctx, []string{"sleep", "60"}, nil)
			got <- result{err, time.Since(start)}
			return err
		}
	})
	var d desktop.Desktop
	e.mustDo("POST", "/v1/desktops", e.key, map[string]any{"name": "d"}, 201, &d)
	var r result
	select {
	case r = <-got:
	case <-time.After(2 * time.Minute):
		t.Fatal("the setup's exec never returned")
	}
	// The exec's own timeout (3 s, what the context leaves in whole seconds) ends it before
	// the context does: a timeout the setup can report, not a cancelled call.
	if r.err == nil || !strings.Contains(r.err.Error(), "did not finish within 3s") {
		t.Errorf("exec answered %v after %s, want its timeout of 3s", r.err, r.elapsed)
	}
	d = e.waitDesktop(d.ID, desktop.Failed)
	if !strings.Contains(d.Message, "did not finish within 3s") {
		t.Errorf("failed with %q", d.Message)
	}
}

// TestDesktopSetupIsBounded: the setup runs under a deadline of desktopSetupWait, so a
// setup whose exec hangs fails the desktop in time, rather than keep it starting (and its
// callers waiting) for an exec's ten minutes. A cold make test's desktop stayed starting for
// four minutes, until the MCP call waiting on it gave up with 504 wake_timeout.
func TestDesktopSetupIsBounded(t *testing.T) {
	deadlines := make(chan time.Duration, 1)
	e := newEnv(t, func(c *Config) {
		c.DesktopSetup = func(ctx context.Context, _ desktop.Execer) error {
			d, ok := ctx.Deadline()
			if !ok {
				deadlines <- -1
				return nil
			}
			deadlines <- time.Until(d)
			return nil
		}
	})
	var d desktop.Desktop
	e.mustDo("POST", "/v1/desktops", e.key, map[string]any{"name": "d"}, 201, &d)
	select {
	case left := <-deadlines:
		if left <= 0 || left > desktopSetupWait {
			t.Errorf("the setup's context leaves %s (-1ns: no deadline), want at most %s", left, desktopSetupWait)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the desktop's setup never began")
	}
	e.waitDesktop(d.ID, desktop.Running)
	if wait := e.gw.desktopWakeWait(); wait < desktopSetupWait+time.Minute {
		t.Errorf("a call waits %s for the desktop, less than its setup may take", wait)
	}
}

// TestDesktopWakeWaitOutlastsAFallback: a call waits for a wake whose memory restore runs to
// its start's deadline (the session's provisioning deadline and startDesktop's minute) and
// then falls back to the disk (wakeFromDisk: a second start, as long, and the display and
// browser's setup): the desktop comes up, and the call that woke it answers with it, not 504
// wake_timeout while the fallback still starts it.
func TestDesktopWakeWaitOutlastsAFallback(t *testing.T) {
	e := newEnv(t)
	tier, _ := e.gw.Tiers.Tier(DesktopTier)
	start := tier.ProvisionDeadline() + time.Minute
	if wait, need := e.gw.desktopWakeWait(), 2*start+desktopSetupWait; wait <= need {
		t.Errorf("a call waits %s for a desktop; a wake whose restore fails at its deadline and starts from the disk may take %s (two starts of %s and the setup's %s)",
			wait, need, start, desktopSetupWait)
	}
}

// TestDesktopRecoveryLeavesItsOwnWork: a transition whose lease lapsed while this gateway
// still works on it (its renewals came late, or Redis was away) is not taken over by this
// gateway's recovery, which renews the lease instead: a second work beside the first fought
// it (a cold make test's sleep found its session snapshotting by the first, and the desktop
// went to sleep without its state).
func TestDesktopRecoveryLeavesItsOwnWork(t *testing.T) {
	inSetup := make(chan struct{}, 4)
	release := make(chan struct{})
	e := newEnv(t, func(c *Config) {
		c.WorkLease = time.Minute // renewed every 20 s: not while the test looks
		c.DesktopSetup = func(ctx context.Context, _ desktop.Execer) error {
			inSetup <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}
	})
	d := e.createInSetup(inSetup)
	ref := store.DesktopRef{Project: e.projA, ID: d.ID}
	token, ok := e.gw.leases.working(ref)
	if !ok {
		t.Fatal("the gateway does not know it works on the desktop's start")
	}
	ctx := context.Background()
	if err := e.st.SetDesktopWork(ctx, ref, token, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	e.gw.recoverDesktop(ctx, ref, time.Now())
	select {
	case <-inSetup:
		t.Fatal("the recovery started the desktop a second time, beside the start still under way")
	case <-time.After(5 * time.Second):
	}
	if due, _, err := e.st.DueDesktopWork(ctx, time.Now(), 10); err != nil || len(due) != 0 {
		t.Errorf("after the recovery's look the lease is still lapsed: %v, %v", due, err)
	}
	close(release)
	if d = e.waitDesktop(d.ID, desktop.Running); d.State != desktop.Running {
		t.Fatalf("the desktop after its setup: %+v", d)
	}
}

// holdFirstDesktopLease holds the first write of a desktop's work lease by its gateway
// (store.SetDesktopWork) until gate closes, then fails it: the gateway is as good as dead
// between the desktop's state and the lease of its work.
func holdFirstDesktopLease(held *atomic.Bool, gate <-chan struct{}) processHook {
	return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if argHas(cmd, "{desktops") && slices.Contains(cmd.Args(), any("set")) && held.CompareAndSwap(false, true) {
			<-gate
			return resetError(cmd)
		}
		return next(ctx, cmd)
	}
}

// TestDesktopStartWithoutItsLease: a gateway dies after it wrote a new desktop's starting and
// before it took the lease of its start. Another gateway's recovery resumes the start once a
// grace period passes (the lease set ahead of the state, which nobody holds); before, nothing
// ever looked at the desktop again, and it stayed starting for ever.
func TestDesktopStartWithoutItsLease(t *testing.T) {
	held := new(atomic.Bool)
	gate := make(chan struct{})
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Second })
	e.rdb.AddHook(holdFirstDesktopLease(held, gate))
	created := make(chan struct{})
	req, _ := http.NewRequest("POST", e.url+"/v1/desktops", strings.NewReader(`{"name":"orphan"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.key)
	go func() { // not e.do: it may not fail the test from here
		defer close(created)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	t.Cleanup(func() { close(gate); <-created })
	var list session.List[desktop.Desktop]
	e.waitFor(func() bool {
		e.mustDo("GET", "/v1/desktops", e.key, nil, 200, &list)
		return len(list.Data) == 1 && held.Load()
	})
	d := list.Data[0]
	if d.State != desktop.Starting || d.SessionID != "" {
		t.Fatalf("with its gateway stuck before the lease: %+v", d)
	}
	d = e.waitDesktop(d.ID, desktop.Running)
	if d.Message != "" || d.SessionID == "" {
		t.Errorf("resumed start: %+v", d)
	}
}

// TestDesktopStuckStartingIsResumed: a desktop that a gateway from before the lease ahead
// left starting with no lease (it died before taking it) gets one when a caller looks at it
// after a work lease, and a recovery resumes its start.
func TestDesktopStuckStartingIsResumed(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Second })
	d := e.newDesktop(map[string]any{"name": "stuck"})
	e.desktopAction(d.ID, "stop", 202)
	e.waitDesktop(d.ID, desktop.Stopped)
	ctx := context.Background()
	rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	// What such a gateway left that died right after it accepted a Start.
	rec.State, rec.From = desktop.Starting, desktop.Stopped
	if _, err := e.st.PutDesktop(ctx, rec, desktop.Stopped); err != nil {
		t.Fatal(err)
	}
	if due, _, _ := e.st.DueDesktopWork(ctx, time.Now().Add(time.Hour), 10); len(due) != 0 {
		t.Fatalf("leases before the look: %v", due)
	}
	time.Sleep(1500 * time.Millisecond)
	if d = e.waitDesktop(d.ID, desktop.Running); d.Message != "" {
		t.Errorf("resumed start: %+v", d)
	}
}

// TestDesktopSweepResumesStuckStart: a desktop that a gateway from before the lease ahead
// left starting with no lease, and that nobody looks at, is found by the sweep, which gives
// it a lease, and a recovery resumes its start. Before, only a caller's look (GET, a call
// that waits for it) gave it one, and one that nobody looked at stayed starting for ever.
func TestDesktopSweepResumesStuckStart(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease, c.DesktopSweep = time.Second, 200*time.Millisecond })
	d := e.newDesktop(map[string]any{"name": "stuck"})
	e.desktopAction(d.ID, "stop", 202)
	e.waitDesktop(d.ID, desktop.Stopped)
	ctx := context.Background()
	rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	// What such a gateway left that died right after it accepted a Start.
	rec.State, rec.From = desktop.Starting, desktop.Stopped
	if _, err := e.st.PutDesktop(ctx, rec, desktop.Stopped); err != nil {
		t.Fatal(err)
	}
	if due, _, _ := e.st.DueDesktopWork(ctx, time.Now().Add(time.Hour), 10); len(due) != 0 {
		t.Fatalf("leases of desktops before the sweep: %v", due)
	}
	// The store, not the API, is read: a GET would give the desktop its lease itself.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if rec, err = e.st.GetDesktop(ctx, e.projA, d.ID); err == nil && rec.State == desktop.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("desktop %s, left starting with no lease and not looked at, is %s (%v), want running", d.ID, rec.State, err)
		}
	}
	if rec.Message != "" || rec.SessionID == "" {
		t.Errorf("resumed start: %+v", rec.Desktop)
	}
}

// TestDesktopSweepIsBounded: a pass of the sweep reads at most its batch of desktops, and the
// walk goes on from where the last pass left off, through every project's desktops, each
// once, until it is done.
func TestDesktopSweepIsBounded(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.DesktopSweep = time.Hour })
	ctx := context.Background()
	projects := []string{e.projA, "proj_sweep_b"}
	if _, err := e.st.EnsureProject(ctx, projects[1], "sweep"); err != nil {
		t.Fatal(err)
	}
	made := 0
	for i, n := range []int{5, 3} {
		for j := range n {
			now := time.Now()
			rec := desktop.Record{Desktop: desktop.Desktop{ID: session.NewID(desktop.IDPrefix, now), Object: desktop.ObjectName,
				ProjectID: projects[i], Name: fmt.Sprintf("d%d", j), Size: "s", State: desktop.Stopped, CreatedAt: *session.At(now)}}
			if _, err := e.st.CreateDesktop(ctx, rec, 100); err != nil {
				t.Fatal(err)
			}
			made++
		}
	}
	var walk desktopWalk
	passes, read := 0, 0
	for done := false; !done; {
		n, d, err := e.gw.sweepDesktops(ctx, &walk, 3)
		if err != nil {
			t.Fatal(err)
		}
		if n > 3 {
			t.Fatalf("pass %d read %d desktops, want at most 3", passes+1, n)
		}
		passes, read, done = passes+1, read+n, d
		if passes > 20 {
			t.Fatalf("the walk is not done after %d passes (%d desktops read of %d)", passes, read, made)
		}
	}
	if read != made || passes < 3 {
		t.Errorf("the walk read %d desktops in %d passes, want %d in 3 or more", read, passes, made)
	}
}

// TestDesktopSweepOneGatewayAPeriod: of three gateways on one Redis, one walks every desktop
// in a period, not each: the walks of a window of 20 periods number about 20, not 60. When
// the gateway whose turn it is stops, another takes the next turn. Before, every gateway
// walked every period.
func TestDesktopSweepOneGatewayAPeriod(t *testing.T) {
	const period = 500 * time.Millisecond
	sweep := func(c *Config) { c.DesktopSweep = period }
	e := newEnv(t, sweep)
	var walks [3]atomic.Int64
	var last atomic.Int64
	last.Store(-1)
	// A walk begins with the read of every project (Store.Projects), which nothing else reads.
	counter := func(i int) processHook {
		return func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			if cmd.Name() == "smembers" && argHas(cmd, "wb:projects") {
				walks[i].Add(1)
				last.Store(int64(i))
			}
			return next(ctx, cmd)
		}
	}
	e.rdb.AddHook(counter(0))
	gws := []*Server{e.gw}
	for i := 1; i < 3; i++ {
		gw, _ := e.gatewayWith(counter(i), sweep)
		gws = append(gws, gw)
	}
	// The first turn is taken within a period of the start; a window then begins.
	time.Sleep(2 * period)
	for i := range walks {
		walks[i].Store(0)
	}
	const window = 20 * period
	time.Sleep(window)
	var got [3]int64
	total := int64(0)
	for i := range walks {
		got[i] = walks[i].Load()
		total += got[i]
	}
	if total > int64(window/period)+2 || total < 2 {
		t.Fatalf("three gateways walked every desktop %d times in %v (%v each), want one walk a period of %v, at most %d",
			total, window, got, period, int64(window/period)+2)
	}
	t.Logf("walks in %v: %v", window, got)
	// The gateway that walked last stops: another takes the next turn.
	h := last.Load()
	gws[h].Close()
	for i := range walks {
		walks[i].Store(0)
	}
	stopped := time.Now()
	for deadline := stopped.Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		others := int64(0)
		for i := range walks {
			if int64(i) != h {
				others += walks[i].Load()
			}
		}
		if others > 0 {
			t.Logf("gateway %d stopped; another walked %v later", h, time.Since(stopped))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway %d, whose turn it was, stopped, and no other gateway walked in %v", h, time.Minute)
		}
	}
}

// TestDesktopRecoveryReadsTheOldLeaseSet: during a rolling deploy, a desktop whose start an
// older gateway leased in the desktops' lease set of before the shards ("wb:{desktops}:work")
// and then died is resumed by this gateway's recovery, which moves the lease to its shard:
// none is left that ends in the old key. Before the shards every lease was there; a recovery
// that read only the shards would leave the desktop starting for ever.
func TestDesktopRecoveryReadsTheOldLeaseSet(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WorkLease = time.Second })
	d := e.newDesktop(map[string]any{"name": "old"})
	e.desktopAction(d.ID, "stop", 202)
	e.waitDesktop(d.ID, desktop.Stopped)
	ctx := context.Background()
	rec, err := e.st.GetDesktop(ctx, e.projA, d.ID)
	if err != nil {
		t.Fatal(err)
	}
	// What an older gateway left that died while it started the desktop: the state, and its
	// lease, lapsed, in the old key.
	rec.State, rec.From = desktop.Starting, desktop.Stopped
	if _, err := e.st.PutDesktop(ctx, rec, desktop.Stopped); err != nil {
		t.Fatal(err)
	}
	member := e.projA + "/" + d.ID
	if err := e.rdb.ZAdd(ctx, "wb:{desktops}:work", redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: member}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HSet(ctx, "wb:{desktops}:worker", member, "lease_older").Err(); err != nil {
		t.Fatal(err)
	}
	// The store, not the API, is read: a GET would look at the desktop itself.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if rec, err = e.st.GetDesktop(ctx, e.projA, d.ID); err == nil && rec.State == desktop.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("desktop %s, whose older gateway died starting it, is %s (%v), want running", d.ID, rec.State, err)
		}
	}
	if rec.Message != "" || rec.SessionID == "" {
		t.Errorf("resumed start: %+v", rec.Desktop)
	}
	// The resumed start releases its lease once it wrote running (holdLease): a loaded
	// machine showed the lease between the two.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		n, err := e.rdb.ZCard(ctx, "wb:{desktops}:work").Result()
		if err == nil && n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leases that end in the old key a minute after the recovery: %d (%v), want none", n, err)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		due, _, err := e.st.DueDesktopWork(ctx, time.Now().Add(time.Hour), 10)
		if err == nil && len(due) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("desktop leases left after the recovery: %v (%v)", due, err)
		}
	}
}
