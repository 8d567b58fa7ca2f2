package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/policies"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// trips records the Redis round trips made with one request's context: each command sent on
// its own, and each pipeline, is one. A new connection's setup (HELLO, CLIENT SETINFO) is
// not counted: the pool dials once per connection, not per request.
type trips struct {
	mu    sync.Mutex
	calls []string // "evalsha", "pipeline[xadd xadd zadd]"
}

func (t *trips) add(call string) {
	t.mu.Lock()
	t.calls = append(t.calls, call)
	t.mu.Unlock()
}

func (t *trips) take() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.calls
	t.calls = nil
	return out
}

type tripsKey struct{}

// tripHook counts the round trips of the calls whose context carries a *trips.
type tripHook struct{}

func (tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if t, ok := ctx.Value(tripsKey{}).(*trips); ok && cmd.Name() != "hello" {
			t.add(cmd.Name())
		}
		return next(ctx, cmd)
	}
}

func (tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if t, ok := ctx.Value(tripsKey{}).(*trips); ok {
			names := make([]string, len(cmds))
			setup := true
			for i, c := range cmds {
				names[i] = c.Name()
				setup = setup && (names[i] == "client" || names[i] == "auth" || names[i] == "select")
			}
			if !setup {
				t.add("pipeline[" + strings.Join(names, " ") + "]")
			}
		}
		return next(ctx, cmds)
	}
}

// tripServer is the gateway alone (no placer, no node) over a redis-server whose client counts
// the round trips each request makes (and only the request's: not the background loops').
func tripServer(t *testing.T, opts ...func(*Config, redis.UniversalClient)) (url, key, project string, tr *trips) {
	t.Helper()
	return tripServerOn(t, redistest.Server(t), opts...)
}

// tripServerOn is tripServer over rdb.
func tripServerOn(t *testing.T, rdb *redis.Client, opts ...func(*Config, redis.UniversalClient)) (url, key, project string, tr *trips) {
	t.Helper()
	rdb.AddHook(tripHook{})
	st := store.New(rdb)
	cfg := Config{Store: st, Limiter: quota.NewRateLimiter(rdb), Accounts: quota.NewAccounts(rdb), Webhooks: webhooks.NewRegistry(rdb),
		Catalog: session.Catalog{{Name: "tpl_base", Digest: "sha256:aaaa"}}, Regions: []string{"local"}, Metrics: NewMetrics(st)}
	for _, o := range opts {
		o(&cfg, rdb)
	}
	gw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr = &trips{}
	h := gw.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tripsKey{}, tr)))
	}))
	t.Cleanup(func() { srv.Close(); gw.Close() })
	p, key, err := st.CreateProject(context.Background(), "trips")
	if err != nil {
		t.Fatal(err)
	}
	return srv.URL, key, p.ID, tr
}

// TestCreateRoundTrips: a common create (no restore_from, no policy_id) on one Redis is one
// round trip: the admission script takes the rate token, checks the spend caps, takes the
// slot, writes the session, signals its work and indexes its provisioning deadline (on a
// Cluster, where those last keys are outside the project's slot, a pipeline follows it:
// store's TestCreateSignals). That is with the default decision point (no Rego, no plugin:
// it allows all). With the Rego engine, whose platform policy reads the slots in use, the
// decision needs the count the first script answers, so the session's write is a second
// script after the decision.
func TestCreateRoundTrips(t *testing.T) {
	withRego := func(c *Config, rdb redis.UniversalClient) {
		ctx := context.Background()
		// Refresh: no re-read of the project's (empty) policy set within the test.
		pol, err := policies.New(ctx, rdb, policies.Options{Refresh: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pol.Close(ctx) })
		c.Policies = pol
	}
	for _, c := range []struct {
		name  string
		opts  []func(*Config, redis.UniversalClient)
		calls []string
	}{
		{"default", nil, []string{"evalsha"}},
		{"rego", []func(*Config, redis.UniversalClient){withRego}, []string{"evalsha", "evalsha"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			url, key, _, tr := tripServer(t, c.opts...)
			hc := &http.Client{}
			for i := range 3 { // the first loads the scripts and fills the caches
				if _, err := post(hc, url, key); err != nil {
					t.Fatal(err)
				}
				calls := tr.take()
				if i > 0 && !slices.Equal(calls, c.calls) {
					t.Fatalf("a create made the round trips %q, want %q", calls, c.calls)
				}
			}
		})
	}
}

// refuseSome is the platform's Rego, then a refusal of the creates of end user eu_refuse; it
// records the slots in use each decision is handed.
type refuseSome struct {
	Chain
	mu   *sync.Mutex
	seen *[]int64
}

func (r refuseSome) Admit(ctx context.Context, in session.AdmissionInput) (session.Decision, error) {
	r.mu.Lock()
	*r.seen = append(*r.seen, in.Active)
	r.mu.Unlock()
	d, err := r.Chain.Admit(ctx, in)
	if err == nil && in.Request.EndUserID == "eu_refuse" {
		d.Allow, d.Reasons = false, []string{"refused"}
	}
	return d, err
}

// TestCreateDecidedHoldsLimits: creates whose decision reads the slots in use (the platform's
// Rego) hold a slot while they are decided: sent at once they never pass the plan's
// concurrency, each decision sees the slots held before its create's, and a refused create
// leaves nothing (no slot, no session, no event).
func TestCreateDecidedHoldsLimits(t *testing.T) {
	rdb := redistest.Server(t)
	var mu sync.Mutex
	var seen []int64
	url, key, project, _ := tripServerOn(t, rdb, func(c *Config, rdb redis.UniversalClient) {
		ctx := context.Background()
		pol, err := policies.New(ctx, rdb, policies.Options{Refresh: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pol.Close(ctx) })
		c.Admitter = refuseSome{Chain: Chain{Policies: pol}, mu: &mu, seen: &seen}
	})
	ctx := context.Background()
	st := store.New(rdb)
	const limit = 4
	if err := st.SetConcurrency(ctx, project, limit); err != nil {
		t.Fatal(err)
	}
	if err := st.SetRate(ctx, project, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	// An endpoint, so that each create writes its event (none is written where none could be
	// delivered), which left counts below. Nothing delivers here.
	if _, err := webhooks.NewRegistry(rdb, webhooks.RegistryOptions{AllowPrivate: true}).Create(ctx, project, "http://127.0.0.1:9/hook", []string{"*"}); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{}
	create := func(endUser string) int {
		req, _ := http.NewRequest("POST", url+"/v1/sessions", strings.NewReader(`{"tier":2,"end_user_id":"`+endUser+`"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	left := func(want int64) {
		t.Helper()
		if n, err := st.ActiveCount(ctx, project); err != nil || n != want {
			t.Fatalf("%d slots held (%v), want %d", n, err, want)
		}
		if page, err := st.List(ctx, project, store.ListQuery{}); err != nil || int64(len(page.Sessions)) != want {
			t.Fatalf("%d sessions (%v), want %d", len(page.Sessions), err, want)
		}
		if evs, err := st.OutboxEvents(ctx, project); err != nil || int64(len(evs)) != want {
			t.Fatalf("%d events (%v), want %d", len(evs), err, want)
		}
	}

	// One at a time: the refused create leaves nothing, and each decision sees the slots held.
	if c := create("eu_refuse"); c != 403 {
		t.Fatalf("refused create: %d", c)
	}
	left(0)
	if c := create("eu_1"); c != 201 {
		t.Fatalf("create: %d", c)
	}
	left(1)
	if !slices.Equal(seen, []int64{0, 0}) {
		t.Fatalf("the decisions saw %v slots in use, want [0 0]", seen)
	}

	// At once: refused creates hold a slot only while decided, so fewer may be written than
	// there are slots, never more.
	codes := make(chan int, 16)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			eu := "eu_1"
			if i%2 == 0 {
				eu = "eu_refuse"
			}
			codes <- create(eu)
		}()
	}
	wg.Wait()
	close(codes)
	written := int64(1)
	for c := range codes {
		switch c {
		case 201:
			written++
		case 403:
		default:
			t.Fatalf("a create answered %d", c)
		}
	}
	if written > limit {
		t.Fatalf("%d sessions written, limit %d", written, limit)
	}
	left(written)
	for written < limit {
		if c := create("eu_1"); c != 201 {
			t.Fatalf("create %d of %d: %d", written+1, limit, c)
		}
		written++
	}
	if c := create("eu_1"); c != 403 { // the platform's Rego refuses it, seeing every slot held
		t.Fatalf("a create past the limit: %d", c)
	}
	left(limit)
}
