package gateway

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/internal/wasmtest"
	"wb/plugins"
	"wb/policies"
	"wb/store"
)

// withCachedDecisionPoints is withDecisionPoints whose engines never re-read a project's
// policies or plugins on their own (an hour): only the announcements of store.Changes tell
// them of a change made elsewhere.
func withCachedDecisionPoints(t *testing.T, rdb redis.UniversalClient) envOpt {
	return func(c *Config) {
		ctx := context.Background()
		pol, err := policies.New(ctx, rdb, policies.Options{Refresh: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		host, err := plugins.NewHost(ctx, rdb, plugins.Options{Timeout: time.Second, RefreshInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pol.Close(ctx); _ = host.Close(ctx) })
		c.Policies, c.Plugins = pol, host
	}
}

// twoGateways answers gateways A and B on one redis-server, each with its own Redis client,
// store, Rego engine and plugin host, as two processes would have.
func twoGateways(t *testing.T) (a, b *env) {
	t.Helper()
	addr := redistest.ServerAddr(t)
	client := func() redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ra, rb := client(), client()
	a = newEnvOn(t, ra, withCachedDecisionPoints(t, ra))
	b = newEnvOn(t, rb, withCachedDecisionPoints(t, rb))
	return a, b
}

// A key revoked through gateway A is refused by the very next request on gateway B, which
// had it cached.
func TestCacheKeyRevokedOnEveryGateway(t *testing.T) {
	a, b := twoGateways(t)
	proj, key := a.newProject("revoke", nil)
	_, other := a.newProject("other", nil)
	b.mustDo("GET", "/v1/sessions", key, nil, 200, nil) // B keeps the key
	b.mustDo("GET", "/v1/sessions", other, nil, 200, nil)
	a.mustDo("GET", "/v1/sessions", key, nil, 200, nil)

	expectError(t, a.do("DELETE", "/v1/admin/projects/"+proj+"/keys/"+store.KeyPrefix(key), key, nil), 401, "unauthenticated", "")
	var out APIKeyRevoked
	a.mustDo("DELETE", "/v1/admin/projects/"+proj+"/keys/"+store.KeyPrefix(key), adminKey, nil, 200, &out)
	if out != (APIKeyRevoked{Object: "api_key", ProjectID: proj, Prefix: store.KeyPrefix(key), Revoked: true}) {
		t.Fatalf("revoked: %+v", out)
	}
	expectError(t, b.do("GET", "/v1/sessions", key, nil), 401, "unauthenticated", "")
	expectError(t, a.do("GET", "/v1/sessions", key, nil), 401, "unauthenticated", "")
	b.mustDo("GET", "/v1/sessions", other, nil, 200, nil) // another project's key still works
	// Once revoked the prefix names no key.
	expectError(t, a.do("DELETE", "/v1/admin/projects/"+proj+"/keys/"+store.KeyPrefix(key), adminKey, nil), 404, "not_found", "")
	expectError(t, a.do("DELETE", "/v1/admin/projects/"+proj+"/keys/"+store.KeyPrefix(other), adminKey, nil), 404, "not_found", "")
}

// A plan lowered through gateway A (the operator's plan, or the tenant's own lower limits)
// holds the very next create on gateway B, which had the project cached.
func TestCachePlanLoweredOnEveryGateway(t *testing.T) {
	a, b := twoGateways(t)
	proj, key := a.newProject("plan", nil)
	b.create(key, map[string]any{"tier": 2}) // B keeps the project; one slot is held

	// The operator's plan: concurrency 1, which the session above fills. The platform's Rego
	// refuses it first (403), from the plan it is handed; the store's script would (429).
	a.mustDo("PUT", "/v1/admin/projects/"+proj+"/plan", adminKey, map[string]any{"concurrency": 1}, 200, nil)
	if r := b.do("POST", "/v1/sessions", key, map[string]any{"tier": 2}); r.status != 403 || !strings.Contains(string(r.body), "1 of 1 sessions active") {
		t.Fatalf("a create past the lowered concurrency: %d %s", r.status, r.body)
	}

	// The tenant's own lower rate: none at all.
	a.mustDo("PUT", "/v1/admin/projects/"+proj+"/plan", adminKey, map[string]any{"concurrency": 10}, 200, nil)
	b.create(key, map[string]any{"tier": 2})
	a.mustDo("PUT", "/v1/limits", key, map[string]any{"rate_per_sec": 0}, 200, nil)
	expectError(t, b.do("POST", "/v1/sessions", key, map[string]any{"tier": 2}), 429, "rate_limited", "")
}

// A policy stored through gateway A decides the very next create on gateway B, whose engine
// had the project's (empty) policy set loaded; so does a plugin.
func TestCachePolicyAndPluginOnEveryGateway(t *testing.T) {
	a, b := twoGateways(t)
	_, key := a.newProject("decide", nil)
	b.create(key, map[string]any{"tier": 4, "region": "far"}) // B loads the project's policies and plugins

	if r := a.putPolicy(key, "tier4", "enforce", tier4Policy); r.status != 201 {
		t.Fatalf("PUT policy: %d %s", r.status, r.body)
	}
	expectError(t, b.do("POST", "/v1/sessions", key, map[string]any{"tier": 4, "region": "far"}), 403, "denied", "")

	b.create(key, map[string]any{"tier": 2})
	deny := wasmtest.ConstPlugin(`{"allow":false,"reasons":["closed for the night"]}`)
	if r := a.do("PUT", "/v1/plugins/night?points=admission", key, deny, "Content-Type", "application/wasm"); r.status != 201 {
		t.Fatalf("PUT plugin: %d %s", r.status, r.body)
	}
	expectError(t, b.do("POST", "/v1/sessions", key, map[string]any{"tier": 2}), 403, "denied", "")
	a.mustDo("DELETE", "/v1/plugins/night", key, nil, 200, nil)
	b.create(key, map[string]any{"tier": 2})
}

// When the gateway's subscription to the announcements is lost (here: Redis closes it), what
// it kept is dropped: announcements made meanwhile were lost. The next requests read the key
// again, and once subscribed again it keeps what it reads.
func TestCacheDroppedWhenSubscriptionLost(t *testing.T) {
	rdb := redistest.Server(t)
	url, key, _, tr := tripServerOn(t, rdb)
	hc := &http.Client{}
	// GET /v1/templates reads nothing of Redis but the key and its project.
	get := func() []string {
		t.Helper()
		req, _ := http.NewRequest("GET", url+"/v1/templates", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("GET /v1/templates: %d", resp.StatusCode)
		}
		return tr.take()
	}
	// The key (GET), then its project (HGETALL, pipelined with the key's index entry).
	readsKey := func(calls []string) bool {
		return slices.Contains(calls, "get") && slices.ContainsFunc(calls, func(c string) bool { return strings.Contains(c, "hgetall") })
	}
	get()
	if calls := get(); readsKey(calls) {
		t.Fatalf("the key was read again while cached: %q", calls)
	}
	if err := rdb.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	// The loss is seen at once (the connection is closed); within a few requests the key is
	// read again, and then kept again.
	deadline := time.Now().Add(30 * time.Second)
	for !readsKey(get()) {
		if time.Now().After(deadline) {
			t.Fatal("the key is still served from the cache after the subscription was lost")
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline = time.Now().Add(30 * time.Second)
	for readsKey(get()) {
		if time.Now().After(deadline) {
			t.Fatal("the key is never kept again after the subscription came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
