package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestStoreUnavailable: while Redis is away (here stopped; in a fleet, a Cluster primary
// killed until its replica takes over) the API answers 503 store_unavailable with a
// Retry-After, not a 500 (which it answered before), and serves again once Redis is back.
func TestStoreUnavailable(t *testing.T) {
	p := redistest.StartDurableProc(t) // its data outlives the stop, to serve again after
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DialTimeout: time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { rdb.Close() })
	e := newEnvOn(t, rdb)
	e.create(e.key, map[string]any{"tier": 2}) // the key is now in the gateway's auth cache
	p.Stop()
	for _, c := range []struct{ method, path string }{{"POST", "/v1/sessions"}, {"GET", "/v1/sessions"}, {"GET", "/v1/snapshots"}} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"tier": 2}
		}
		r := e.do(c.method, c.path, e.key, body)
		code, _, msg := r.errorOf(t)
		if r.status != 503 || code != "store_unavailable" || r.header.Get("Retry-After") == "" {
			t.Errorf("%s %s with Redis stopped: %d %s %q (Retry-After %q), want 503 store_unavailable with a Retry-After",
				c.method, c.path, r.status, code, msg, r.header.Get("Retry-After"))
		}
	}
	p.Start()
	// The client's pool waits out its dial backoff before it reconnects.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2})
		if r.status == 201 {
			break
		}
		if r.status != 503 || time.Now().After(deadline) {
			t.Fatalf("POST /v1/sessions with Redis back: %d %s", r.status, r.body)
		}
	}
}

// redisErr is an error answer of a Redis server, as go-redis returns one.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

func TestStoreUnavailableErrors(t *testing.T) {
	for _, err := range []error{redisErr("CLUSTERDOWN The cluster is down"), redisErr("TRYAGAIN Multiple keys request during rehashing of slot"),
		redisErr("LOADING Redis is loading the dataset in memory"), redisErr("READONLY You can't write against a read only replica."),
		redisErr("MASTERDOWN Link with MASTER is down"), redis.ErrPoolTimeout,
		// A pooled connection that the killed server closed, as its next command finds it (go-redis
		// does not peek first: internal/redisconn); a chaos test's create got a 500 for it.
		fmt.Errorf("idempotency: %w", io.EOF), io.ErrUnexpectedEOF} {
		if ae := toAPIError(fmt.Errorf("create session: %w", err)); ae.Status != 503 || ae.Code != "store_unavailable" {
			t.Errorf("%v: %d %s, want 503 store_unavailable", err, ae.Status, ae.Code)
		}
	}
	for _, err := range []error{redisErr("ERR unknown command"), redisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), fmt.Errorf("a bug")} {
		if ae := toAPIError(fmt.Errorf("create session: %w", err)); ae.Status != 500 {
			t.Errorf("%v: %d %s, want 500", err, ae.Status, ae.Code)
		}
	}
}

// stopDuringDecision stops Redis while it decides a create (once), then allows it.
type stopDuringDecision struct {
	once *sync.Once
	stop func()
}

func (a stopDuringDecision) Admit(context.Context, session.AdmissionInput) (session.Decision, error) {
	a.once.Do(a.stop)
	return session.Decision{Allow: true}, nil
}

// TestSlotGivenBackAfterAnOutage: a create whose slot was reserved, and whose write and
// release then both failed (Redis went away while it was decided, as in a Cluster failover),
// answers 503, and its slot is given back once Redis is back, with no other create. Before,
// it stayed held until the project's next create a minute later; a chaos test found it so.
func TestSlotGivenBackAfterAnOutage(t *testing.T) {
	p := redistest.StartDurableProc(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DialTimeout: time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { rdb.Close() })
	e := newEnvOn(t, rdb, func(c *Config) { c.Admitter = stopDuringDecision{once: &sync.Once{}, stop: p.Stop} })
	r := e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2})
	if code, _, msg := r.errorOf(t); r.status != 503 || code != "store_unavailable" {
		t.Fatalf("a create while Redis went away: %d %s %q, want 503 store_unavailable", r.status, code, msg)
	}
	p.Start()
	e.waitNoSlots("Redis came back", "the refused create's slot was not given back")
}

// TestSlotGivenBackAfterALostAnswer: a create whose reservation's script ran but whose answer
// never came back (the connection failed under it, as when a primary is killed) answers 503,
// and the slot the script held is given back with no other create. Before, it stayed held
// until the project's next create a minute later (the gateway could not know it was held).
func TestSlotGivenBackAfterALostAnswer(t *testing.T) {
	rdb := redistest.Server(t)
	rdb.AddHook(loseAnswer{once: &sync.Once{}, arg: "reserve"})
	e := newEnvOn(t, rdb, func(c *Config) { c.Admitter = stopDuringDecision{once: &sync.Once{}, stop: func() {}} })
	r := e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2})
	if code, _, msg := r.errorOf(t); r.status != 503 || code != "store_unavailable" {
		t.Fatalf("a create whose reservation's answer was lost: %d %s %q, want 503 store_unavailable", r.status, code, msg)
	}
	e.waitNoSlots("the lost answer", "the slot its reservation held was not given back")
}

// TestSessionOfALostAnswerDeleted: a create whose write went through but whose answer was
// lost (the connection failed under it) answers 503, and the session it wrote, whose id the
// caller never learns, is deleted in the background and its slot given back. Before, it ran
// unseen, and billed, until its idle timeout. Both ways a create is written: in one step (no
// decision to make) and after its decision (Commit).
func TestSessionOfALostAnswerDeleted(t *testing.T) {
	eachWayOfWriting(t, false, func(t *testing.T, e *env) {
		r := e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2})
		if code, _, msg := r.errorOf(t); r.status != 503 || code != "store_unavailable" {
			t.Fatalf("a create whose answer was lost: %d %s %q, want 503 store_unavailable", r.status, code, msg)
		}
		ctx := context.Background()
		var list struct{ Data []session.Session }
		var n int64
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			e.mustDo("GET", "/v1/sessions", e.key, nil, 200, &list)
			n, _ = e.st.ActiveCount(ctx, e.projA)
			if len(list.Data) == 1 && list.Data[0].State == session.Stopped && n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("30 s after the lost answer: sessions %+v, %d slots held; want its session stopped and none", list.Data, n)
			}
		}
		if got := list.Data[0].StateReason; got == nil || *got != session.Deleted {
			t.Errorf("the unanswered create's session ended for %v, want deleted", got)
		}
	})
}

// TestCreateAnsweredAfterItsRetry: a create's write that went through with its answer lost,
// and that the Redis client then sent again (go-redis retries a command whose connection
// failed), finds its own session: the create answers 201 with it, and no second session is
// made. Before, it answered 500 (the id existed), and the session ran unseen. Both ways a
// create is written: in one step and after its decision (Commit).
func TestCreateAnsweredAfterItsRetry(t *testing.T) {
	eachWayOfWriting(t, true, func(t *testing.T, e *env) {
		var created session.Session
		e.mustDo("POST", "/v1/sessions", e.key, map[string]any{"tier": 2}, 201, &created)
		var list struct{ Data []session.Session }
		e.mustDo("GET", "/v1/sessions", e.key, nil, 200, &list)
		if len(list.Data) != 1 || list.Data[0].ID != created.ID {
			t.Fatalf("sessions after the create: %+v, want the one answered (%s)", list.Data, created.ID)
		}
		if n, err := e.st.ActiveCount(context.Background(), e.projA); err != nil || n != 1 {
			t.Errorf("the project holds %d slots (%v), want 1", n, err)
		}
	})
}

// eachWayOfWriting runs f on a gateway of each way a create is written, in one step (no
// decision to make) and after its decision (Commit), with the first write's answer lost on
// its way back (loseAnswer; again: sent again, as go-redis retries it).
func eachWayOfWriting(t *testing.T, again bool, f func(t *testing.T, e *env)) {
	for _, c := range []struct {
		name, arg string
		decide    bool
	}{{"one step", "doc", false}, {"after a decision", "commit", true}} {
		t.Run(c.name, func(t *testing.T) {
			rdb := redistest.Server(t)
			rdb.AddHook(loseAnswer{once: &sync.Once{}, arg: c.arg, again: again})
			var opts []envOpt
			if c.decide {
				opts = append(opts, func(cfg *Config) { cfg.Admitter = stopDuringDecision{once: &sync.Once{}, stop: func() {}} })
			}
			f(t, newEnvOn(t, rdb, opts...))
		})
	}
}

// waitNoSlots waits up to 30 s for project A to hold no slot, after what happened, failing
// with why otherwise.
func (e *env) waitNoSlots(after, why string) {
	e.t.Helper()
	var n int64
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if n, err = e.st.ActiveCount(context.Background(), e.projA); err == nil && n == 0 {
			return
		}
	}
	e.t.Fatalf("30 s after %s, the project holds %d slots (%v), want 0: %s", after, n, err, why)
}

// loseAnswer runs the first command with arg among its arguments, then answers it with a
// connection reset, as if the answer were lost on the way back; or, again, runs it a second
// time and answers that one's result, as go-redis does when the first's answer was lost.
type loseAnswer struct {
	once  *sync.Once
	arg   string
	again bool
}

func (loseAnswer) DialHook(next redis.DialHook) redis.DialHook { return next }
func (loseAnswer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h loseAnswer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && slices.Contains(cmd.Args(), any(h.arg)) {
			h.once.Do(func() {
				if h.again {
					err = next(ctx, cmd)
					return
				}
				err = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
				cmd.SetErr(err)
			})
		}
		return err
	}
}

// TestWriteUnanswered: a create's failed write counts as possibly written unless the store
// answered a refusal.
func TestWriteUnanswered(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{store.ErrExists, false},
		{fmt.Errorf("create session: %w", store.ErrLapsed), false},
		{&store.RateLimitError{Wait: time.Second}, false},
		{&store.SpendCapError{Scope: "project"}, false},
		{fmt.Errorf("create: %w", &store.ConcurrencyError{Limit: 1, Used: 1}), false},
		{&session.FieldError{Field: "id", Message: "required"}, false},
		{fmt.Errorf("create session: %w", io.EOF), true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{redisErr("CLUSTERDOWN The cluster is down"), true},
		{context.DeadlineExceeded, true},
	} {
		if got := writeUnanswered(c.err); got != c.want {
			t.Errorf("writeUnanswered(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestKeyedSlotGivenBackAfterAnOutage: as TestSlotGivenBackAfterAnOutage, for a create with an
// Idempotency-Key (its id is the key's, which a retry shares): its slot is given back too,
// once Redis is back. Before, it was left to the one-minute lapse, since a late release could
// have taken the slot from a retry's; the release now spares a slot a retry took over.
func TestKeyedSlotGivenBackAfterAnOutage(t *testing.T) {
	p := redistest.StartDurableProc(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DialTimeout: time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { rdb.Close() })
	e := newEnvOn(t, rdb, func(c *Config) { c.Admitter = stopDuringDecision{once: &sync.Once{}, stop: p.Stop} })
	r := e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2}, "Idempotency-Key", "outage-1")
	if code, _, msg := r.errorOf(t); r.status != 503 || code != "store_unavailable" {
		t.Fatalf("a keyed create while Redis went away: %d %s %q, want 503 store_unavailable", r.status, code, msg)
	}
	p.Start()
	e.waitNoSlots("Redis came back", "the keyed create's slot was not given back")
}
