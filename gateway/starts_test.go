package gateway

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// startsEnv is a store over its own redis-server, a session of tier 1 placed on a node
// (provisioning), and a server whose runs are told of their session's start, as New makes it.
type startsEnv struct {
	t     *testing.T
	rdb   *redis.Client
	st    *store.Store
	s     *Server
	p     string
	looks atomic.Int64 // HGETs and HGETALLs of sessions
	lie   atomic.Bool  // an HGET of a session's state answers provisioning
	// runs are run's starts: a wait told of a start by the script's announcement may answer
	// before the script's caller has its reply, so the test waits for them before its Redis
	// client is closed.
	runs sync.WaitGroup
}

func newStartsEnv(t *testing.T) *startsEnv { return newStartsEnvOn(t, redistest.Server(t)) }

func newStartsEnvOn(t *testing.T, rdb *redis.Client) *startsEnv {
	e := &startsEnv{t: t, rdb: rdb}
	e.rdb.AddHook(startsHook{e})
	e.st = store.New(e.rdb)
	p, _, err := e.st.CreateProject(context.Background(), "starts")
	if err != nil {
		t.Fatal(err)
	}
	e.p = p.ID
	e.s = &Server{Config: Config{Store: e.st, Tiers: session.DefaultTiers()}, starts: newStartWaits()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.st.WatchStarts(ctx, nil, store.StartWatch{Started: e.s.starts.started, Live: e.s.starts.live})
	}()
	t.Cleanup(func() { cancel(); <-done })
	t.Cleanup(e.runs.Wait)
	e.waitEpoch(1)
	return e
}

// waitEpoch waits for the subscription's epoch n (odd: it holds).
func (e *startsEnv) waitEpoch(n uint64) {
	e.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); e.s.starts.epoch.Load() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("the subscription's epoch is %d after 20 s, want %d", e.s.starts.epoch.Load(), n)
		}
	}
}

// placed creates a tier-1 session and places it on a node.
func (e *startsEnv) placed() *session.Session {
	e.t.Helper()
	ctx := context.Background()
	sess := &session.Session{ID: session.NewID("sess_", time.Now()), Tier: 1, State: session.Pending, ProjectID: e.p,
		Template: "tpl_base@sha256:aaaa", Region: "local", IdleTimeoutS: 300, MaxLifetimeS: 3600, CreatedAt: *session.At(time.Now())}
	if _, err := e.st.Create(ctx, sess, 100); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.st.Transition(ctx, store.Change{Project: e.p, ID: sess.ID, From: session.Pending, To: session.Provisioning, Driver: session.Placer, NodeID: "node_a"}); err != nil {
		e.t.Fatal(err)
	}
	return sess
}

// run starts the session after d: announced by the store's script, or, as a node of a wb
// that announces nothing, by writing its state alone.
func (e *startsEnv) run(sess *session.Session, d time.Duration, announced bool) <-chan time.Time {
	ran := make(chan time.Time, 1)
	e.runs.Go(func() {
		time.Sleep(d)
		ran <- time.Now()
		var err error
		if announced {
			_, err = e.st.Transition(context.Background(), store.Change{Project: e.p, ID: sess.ID, From: session.Provisioning, To: session.Running, Driver: session.Node})
		} else {
			err = e.rdb.HSet(context.Background(), "wb:{"+e.p+"}:s:"+sess.ID, "state", "running").Err()
		}
		if err != nil {
			e.t.Error(err)
		}
	})
	return ran
}

// wait is waitRunning's answer for sess, within 10 s.
func (e *startsEnv) wait(sess *session.Session) (*session.Session, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.s.waitRunning(ctx, sess)
}

// TestWaitRunningIsTold: a run whose session starts 200 ms after it began to wait is told of
// the start, and looks at the session only as a fallback meanwhile (at 5 ms, spacing out to
// 25 ms): about 15 looks. Before, it looked every millisecond for the first 50 ms (about 65).
func TestWaitRunningIsTold(t *testing.T) {
	e := newStartsEnv(t)
	sess := e.placed()
	e.looks.Store(0)
	e.run(sess, 200*time.Millisecond, true)
	got, err := e.wait(sess)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != session.Running {
		t.Fatalf("waitRunning answered a session %s", got.State)
	}
	t.Logf("%d looks", e.looks.Load())
	if n := e.looks.Load(); n > 25 {
		t.Errorf("waitRunning looked at the session %d times in a start of 200 ms, want at most 25", n)
	}
	// Told: the start is seen though no look at the state sees it (the looks lie).
	sess = e.placed()
	e.lie.Store(true)
	e.run(sess, 200*time.Millisecond, true)
	if got, err = e.wait(sess); err != nil || got.State != session.Running {
		t.Fatalf("a session whose start only its announcement tells: waitRunning answered %v, %v", got, err)
	}
}

// TestWaitRunningUnannounced: a session started by a node of a wb that does not announce it
// (a rolling deploy) is still seen, by the looks, within runPollSlow (wide here: 1 s).
func TestWaitRunningUnannounced(t *testing.T) {
	e := newStartsEnv(t)
	sess := e.placed()
	ran := e.run(sess, 200*time.Millisecond, false)
	got, err := e.wait(sess)
	seen := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if got.State != session.Running {
		t.Fatalf("waitRunning answered a session %s", got.State)
	}
	if late := seen.Sub(<-ran); late > time.Second {
		t.Errorf("waitRunning saw the unannounced session running %s after it was", late)
	}
}

// TestWaitRunningSubscriptionLost: when the subscription drops, a wait looks at its session
// again, and often (a start is seen though its announcement is lost); the subscription is
// made again, and a later wait is told of its session's start; so too after Redis restarts.
func TestWaitRunningSubscriptionLost(t *testing.T) {
	proc := redistest.StartDurableProc(t)
	rdb := redis.NewClient(&redis.Options{Addr: proc.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	e := newStartsEnvOn(t, rdb)
	ctx := context.Background()
	sess := e.placed()
	answer := make(chan error, 1)
	go func() {
		got, err := e.wait(sess)
		if err == nil && got.State != session.Running {
			err = fmt.Errorf("waitRunning answered a session %s", got.State)
		}
		answer <- err
	}()
	time.Sleep(100 * time.Millisecond) // waiting, told
	if err := e.rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	e.waitEpoch(2)
	// Started while nobody hears it: on a node of this wb, but the announcement is lost.
	if _, err := e.st.Transition(ctx, store.Change{Project: e.p, ID: sess.ID, From: session.Provisioning, To: session.Running, Driver: session.Node}); err != nil {
		t.Fatal(err)
	}
	if err := <-answer; err != nil {
		t.Fatalf("a session that started while the subscription was down: %v", err)
	}
	e.waitEpoch(3)
	sess = e.placed()
	e.lie.Store(true) // only its announcement tells the start
	e.run(sess, 200*time.Millisecond, true)
	if got, err := e.wait(sess); err != nil || got.State != session.Running {
		t.Fatalf("a session that started after the subscription was made again: waitRunning answered %v, %v", got, err)
	}
	e.lie.Store(false)
	proc.Stop()
	proc.Start()
	e.waitEpoch(5)
	sess = e.placed()
	e.lie.Store(true)
	e.run(sess, 200*time.Millisecond, true)
	if got, err := e.wait(sess); err != nil || got.State != session.Running {
		t.Fatalf("a session that started after Redis restarted: waitRunning answered %v, %v", got, err)
	}
}

// startsHook counts the env's looks at sessions, and makes an HGET of a state answer
// provisioning while the env lies.
type startsHook struct{ e *startsEnv }

func (startsHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h startsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.saw(cmd)
		return err
	}
}

func (h startsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.saw(c)
		}
		return err
	}
}

func (h startsHook) saw(cmd redis.Cmder) {
	switch cmd.Name() {
	case "hgetall":
		h.e.looks.Add(1)
	case "hget":
		h.e.looks.Add(1)
		if c, ok := cmd.(*redis.StringCmd); ok && h.e.lie.Load() && len(cmd.Args()) == 3 && cmd.Args()[2] == "state" {
			c.SetVal(string(session.Provisioning))
			c.SetErr(nil)
		}
	}
}

// TestStartWaitsBounded: the waits registered are at most maxStartWaits (more wait by looking
// alone), each leaves when done, and an announcement of a session nobody here waits for is
// dropped; a lost subscription wakes every wait.
func TestStartWaitsBounded(t *testing.T) {
	w := newStartWaits()
	w.live(true)
	var dones []func()
	for i := range maxStartWaits {
		ch, done := w.add(store.SessionRef{Project: "p", ID: fmt.Sprint(i)})
		if ch == nil {
			t.Fatalf("wait %d refused, want %d registered", i, maxStartWaits)
		}
		dones = append(dones, done)
	}
	if ch, _ := w.add(store.SessionRef{Project: "p", ID: "over"}); ch != nil {
		t.Fatalf("a wait past %d registered", maxStartWaits)
	}
	same, doneSame := w.add(store.SessionRef{Project: "p", ID: "0"}) // a second wait for one session
	if same != nil {
		t.Fatalf("a wait past %d registered", maxStartWaits)
	}
	doneSame()
	w.started(store.SessionRef{Project: "p", ID: "unknown"})
	if len(w.m) != maxStartWaits {
		t.Fatalf("%d sessions waited for after an unknown one was announced, want %d", len(w.m), maxStartWaits)
	}
	for _, done := range dones {
		done()
	}
	if len(w.m) != 0 || w.n != 0 {
		t.Fatalf("%d sessions (%d waits) waited for after every wait ended, want 0", len(w.m), w.n)
	}
	a, doneA := w.add(store.SessionRef{Project: "p", ID: "a"})
	b, doneB := w.add(store.SessionRef{Project: "p", ID: "a"})
	defer doneA()
	w.started(store.SessionRef{Project: "p", ID: "a"})
	for _, ch := range []chan struct{}{a, b} {
		select {
		case <-ch:
		default:
			t.Fatal("a wait for an announced session was not woken")
		}
	}
	doneB()
	w.live(false)
	select {
	case <-a:
	default:
		t.Fatal("a wait was not woken when the subscription was lost")
	}
	if e := w.epoch.Load(); e != 2 {
		t.Fatalf("epoch %d after the subscription held and was lost, want 2", e)
	}
}
