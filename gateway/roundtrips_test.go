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

// TestCreateRoundTrips: a common create (no restore_from, no policy_id) with the default
// decision point (no Rego, no plugin: it allows all) makes one admission round trip (rate
// limit, spend caps, slot and write in one script) and one more that signals its work and
// indexes its provisioning deadline: those keys are global, outside the project's Cluster
// slot, so no script of the project's may write them. With the Rego engine, whose platform
// policy reads the slots in use, the admission takes two: the rate limit, the caps and the
// count, then the slot and the write.
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
		name string
		opts []func(*Config, redis.UniversalClient)
		want []string // the round trips before the signals' pipeline
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
				if i == 0 {
					continue
				}
				n := len(c.want)
				if len(calls) != n+1 || !slices.Equal(calls[:n], c.want) || !strings.HasPrefix(calls[n], "pipeline[") {
					t.Fatalf("a create made %d round trips, want %d (%q, then the signals): %q", len(calls), n+1, c.want, calls)
				}
				for _, name := range strings.Fields(strings.Trim(strings.TrimPrefix(calls[n], "pipeline["), "]")) {
					if name != "xadd" && name != "zadd" {
						t.Fatalf("the pipeline after the admission has %s: %q", name, calls[n])
					}
				}
			}
		})
	}
}
