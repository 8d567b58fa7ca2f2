package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/console"
	"wb/desktop"
	"wb/internal/fakenode"
	"wb/internal/redistest"
	"wb/internal/stallwrite"
	"wb/placer"
	"wb/policies"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

const adminKey = "wb_admin_test"

type env struct {
	t     *testing.T
	url   string
	rdb   redis.UniversalClient
	st    *store.Store
	node  *fakenode.Node
	gw    *Server
	srv   *httptest.Server
	key   string // project A's key
	projA string
}

// heartbeating keeps the fake node's registration fresh while the test runs, every second.
func heartbeating(t *testing.T, n *fakenode.Node) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				_ = n.Heartbeat(ctx)
			}
		}
	}()
}

type envOpt func(*Config)

func newEnv(t *testing.T, opts ...envOpt) *env {
	t.Helper()
	rdb := redistest.Server(t)
	return newEnvOn(t, rdb, opts...)
}

func newEnvOn(t *testing.T, rdb redis.UniversalClient, opts ...envOpt) *env {
	t.Helper()
	return newEnvTiers(t, rdb, patientTiers(), opts...)
}

// patientTiers are the default tiers with a provisioning deadline of minutes: the fake node
// starts each guest's agent as a process, and on a loaded machine (a cold make test) one took
// longer than tier 2's 9 s, which failed a session that a test waited to see running.
func patientTiers() session.Tiers {
	tiers := session.DefaultTiers()
	for i := range tiers {
		tiers[i].ColdP95 = time.Minute
	}
	return tiers
}

// newEnvTiers is newEnvOn with tiers given to the store, the placer and the gateway alike
// (a test shortens a tier's provisioning deadline rather than wait out the default).
func newEnvTiers(t *testing.T, rdb redis.UniversalClient, tiers session.Tiers, opts ...envOpt) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := store.New(rdb, store.WithTiers(tiers))
	node, err := fakenode.New(ctx, st, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// As a real node does: a test that outlasts the placer's heartbeat timeout (10 s), as a
	// loaded machine makes many, would find the node dead and its sessions left pending.
	heartbeating(t, node)
	cfg := Config{
		Store: st, Limiter: quota.NewRateLimiter(rdb), Accounts: quota.NewAccounts(rdb), Webhooks: webhooks.NewRegistry(rdb, webhooks.RegistryOptions{AllowPrivate: true}), Guests: node,
		Catalog: session.Catalog{
			{Name: "tpl_base", Digest: "sha256:aaaa", Runtimes: []session.Runtime{{Name: "sh", Argv: []string{"/bin/sh", "-c"}}}},
			{Name: "tpl_dev_polyglot", Digest: "sha256:bbbb", Runtimes: []session.Runtime{{Name: "python3", Argv: []string{"python3", "-c"}, Version: "3.11.2"}}},
		},
		Regions: []string{"local", "far"}, AdminKey: adminKey, Metrics: NewMetrics(st), Tiers: tiers,
	}
	for _, o := range opts {
		o(&cfg)
	}
	// The placer judges nodes by the gateway's node timeout, as wb serve's does.
	pl := placer.New(placer.Config{Store: st, Provisioner: node, Tiers: tiers, HeartbeatTimeout: cfg.NodeTimeout})
	done := make(chan struct{})
	go func() { _ = pl.Run(ctx); close(done) }()
	gw, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(gw.Handler())
	srv.Config.ConnContext = stallwrite.ConnContext // as wb serve's
	srv.Start()
	gw.PublicURL = srv.URL
	e := &env{t: t, url: srv.URL, rdb: rdb, st: st, node: node, gw: gw, srv: srv}
	t.Cleanup(func() {
		srv.Close()
		gw.Close()
		cancel()
		<-done
		node.Close()
	})
	e.projA, e.key = e.newProject("A", nil)
	return e
}

// newProject creates a project through the admin route and answers its id and key.
func (e *env) newProject(name string, concurrency *int) (string, string) {
	e.t.Helper()
	body := map[string]any{"name": name}
	if concurrency != nil {
		body["concurrency"] = *concurrency
	}
	var out struct {
		ProjectID string `json:"project_id"`
		APIKey    string `json:"api_key"`
	}
	e.mustDo("POST", "/v1/admin/projects", adminKey, body, 201, &out)
	return out.ProjectID, out.APIKey
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not JSON: %s", r.body)
	}
	return m
}

// errorOf answers the error object's code, param and message.
func (r response) errorOf(t testing.TB) (string, string, string) {
	t.Helper()
	var m struct {
		Error struct{ Type, Code, Message, Param string } `json:"error"`
	}
	if err := json.Unmarshal(r.body, &m); err != nil || m.Error.Code == "" || m.Error.Message == "" {
		t.Fatalf("not an error body: %s", r.body)
	}
	return m.Error.Code, m.Error.Param, m.Error.Message
}

// do sends a request; body may be nil, a []byte sent raw as JSON, or a value to marshal.
// Every answer is validated against the OpenAPI document.
func (e *env) do(method, path, key string, body any, hdr ...string) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	validateResponse(e.t, req, resp, b)
	return response{resp.StatusCode, resp.Header, b}
}

func (e *env) mustDo(method, path, key string, body any, status int, out any, hdr ...string) response {
	e.t.Helper()
	r := e.do(method, path, key, body, hdr...)
	if r.status != status {
		e.t.Fatalf("%s %s: status %d, want %d: %s", method, path, r.status, status, r.body)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			e.t.Fatal(err)
		}
	}
	return r
}

func (e *env) create(key string, body any) session.Session {
	e.t.Helper()
	var s session.Session
	e.mustDo("POST", "/v1/sessions", key, body, 201, &s)
	return s
}

// waitState polls the session until it is in want.
func (e *env) waitState(key, id string, want session.State) session.Session {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var s session.Session
	for time.Now().Before(deadline) {
		e.mustDo("GET", "/v1/sessions/"+id, key, nil, 200, &s)
		if s.State == want {
			return s
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("session %s is %s, want %s", id, s.State, want)
	return s
}

func (e *env) running(body any) session.Session {
	e.t.Helper()
	s := e.create(e.key, body)
	return e.waitState(e.key, s.ID, session.Running)
}

func expectError(t *testing.T, r response, status int, code, param string) string {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	c, p, msg := r.errorOf(t)
	if c != code || (param != "*" && p != param) {
		t.Fatalf("code %q param %q, want %q %q: %s", c, p, code, param, msg)
	}
	return msg
}

func TestAuth(t *testing.T) {
	e := newEnv(t)
	expectError(t, e.do("GET", "/v1/sessions", "", nil), 401, "unauthenticated", "")
	expectError(t, e.do("GET", "/v1/sessions", "wb_live_nope", nil), 401, "unauthenticated", "")
	expectError(t, e.do("POST", "/v1/admin/projects", e.key, map[string]any{"name": "x"}), 401, "unauthenticated", "")
	expectError(t, e.do("POST", "/v1/admin/projects", adminKey, map[string]any{"name": ""}), 400, "invalid_request", "name")
	expectError(t, e.do("POST", "/v1/admin/projects", adminKey, map[string]any{"name": "x", "plan": 1}), 400, "invalid_request", "plan")
	expectError(t, e.do("GET", "/v1/nowhere", e.key, nil), 404, "no_route", "")
	// Keys are stored hashed.
	keys, _ := e.rdb.Keys(context.Background(), "wb:apikey:*").Result()
	for _, k := range keys {
		if strings.Contains(k, e.key) {
			t.Fatal("API key stored in clear")
		}
	}
	if len(keys) == 0 {
		t.Fatal("no hashed key stored")
	}
}

func TestCreateSessionLifecycle(t *testing.T) {
	e := newEnv(t)
	s := e.create(e.key, map[string]any{"tier": 2, "template": "tpl_dev_polyglot", "end_user_id": "eu_1",
		"idle_timeout_s": 120, "metadata": map[string]string{"k": "v"}, "policy_id": "pol_build_tools@7"})
	if s.State != session.Pending || s.Template != "tpl_dev_polyglot@sha256:bbbb" || s.Region != "local" ||
		s.Resources.SizeClass != "s" || s.IdleTimeoutS != 120 || s.MaxLifetimeS != 3600 || s.StartedAt != nil {
		t.Fatalf("created %+v", s)
	}
	if !strings.HasPrefix(s.Connect.ExecURL, e.url+"/v1/sessions/"+s.ID+"/exec?token=") || !strings.HasPrefix(s.Connect.PTYURL, "ws://") {
		t.Fatalf("connect %+v", s.Connect)
	}
	r := e.waitState(e.key, s.ID, session.Running)
	if r.StartedAt == nil || r.ColdStart == nil || *r.ColdStart || r.Zone == nil || *r.Zone != "local-a" ||
		!r.ExpiresAt.Equal(r.StartedAt.Add(time.Hour)) {
		t.Fatalf("running %+v", r)
	}
	var del session.Session
	e.mustDo("DELETE", "/v1/sessions/"+s.ID, e.key, nil, 202, &del)
	if del.State != session.Stopping || *del.StateReason != session.Deleted {
		t.Fatalf("delete answered %+v", del)
	}
	stopped := e.waitState(e.key, s.ID, session.Stopped)
	if stopped.StoppedAt == nil {
		t.Fatal("stopped_at not set")
	}
	e.mustDo("DELETE", "/v1/sessions/"+s.ID, e.key, nil, 200, &del)
	if del.State != session.Stopped {
		t.Fatal("second delete changed it")
	}
	// A pending session (no node fits region "far") is stopped at once.
	far := e.create(e.key, map[string]any{"tier": 2, "region": "far"})
	e.mustDo("DELETE", "/v1/sessions/"+far.ID, e.key, nil, 200, &del)
	if del.State != session.Stopped {
		t.Fatalf("pending delete: %s", del.State)
	}
	if n, _ := e.st.ActiveCount(context.Background(), e.projA); n != 0 {
		t.Fatalf("%d slots held", n)
	}
}

func TestCreateValidation(t *testing.T) {
	e := newEnv(t)
	big := append([]byte(`{"tier":2,"metadata":{"k":"`), bytes.Repeat([]byte("x"), MaxBodyBytes)...)
	big = append(big, `"}}`...)
	cases := []struct {
		name   string
		body   any
		hdr    []string
		status int
		code   string
		param  string
	}{
		{"malformed", []byte(`{"tier": 2,`), nil, 400, "invalid_request", ""},
		{"not an object", []byte(`[1,2]`), nil, 400, "invalid_request", ""},
		{"empty", []byte(``), nil, 400, "invalid_request", ""},
		{"trailing", []byte(`{"tier":2} {}`), nil, 400, "invalid_request", ""},
		{"unknown field", map[string]any{"tier": 2, "colour": "red"}, nil, 400, "invalid_request", "colour"},
		{"unknown nested", map[string]any{"tier": 2, "resources": map[string]any{"gpu": 1}}, nil, 400, "invalid_request", "gpu"},
		{"no tier", map[string]any{}, nil, 400, "invalid_request", "tier"},
		{"negative tier", map[string]any{"tier": -1}, nil, 400, "invalid_request", "tier"},
		{"huge tier", []byte(`{"tier": 1e30}`), nil, 400, "invalid_request", "tier"},
		{"fraction", []byte(`{"tier": 2.5}`), nil, 400, "invalid_request", "tier"},
		{"string tier", []byte(`{"tier": "2"}`), nil, 400, "invalid_request", "tier"},
		{"huge idle", map[string]any{"tier": 2, "idle_timeout_s": 99999999999}, nil, 400, "invalid_request", "idle_timeout_s"},
		{"short idle", map[string]any{"tier": 2, "idle_timeout_s": 29}, nil, 400, "invalid_request", "idle_timeout_s"},
		{"lifetime over tier", map[string]any{"tier": 1, "max_lifetime_s": 7200}, nil, 400, "invalid_request", "max_lifetime_s"},
		{"negative memory", map[string]any{"tier": 2, "resources": map[string]any{"memory_mib": -5}}, nil, 400, "invalid_request", "resources.memory_mib"},
		{"size class", map[string]any{"tier": 1, "resources": map[string]any{"size_class": "xl"}}, nil, 400, "invalid_request", "resources.size_class"},
		{"template", map[string]any{"tier": 2, "template": "tpl_nope"}, nil, 400, "invalid_request", "template"},
		{"template digest", map[string]any{"tier": 2, "template": "tpl_base@sha256:ffff"}, nil, 400, "invalid_request", "template"},
		{"region", map[string]any{"tier": 2, "region": "mars"}, nil, 400, "invalid_request", "region"},
		{"policy id", map[string]any{"tier": 2, "policy_id": "build tools"}, nil, 400, "invalid_request", "policy_id"},
		{"restore from", map[string]any{"tier": 2, "restore_from": "snap_nope"}, nil, 400, "invalid_request", "restore_from"},
		{"content type", []byte(`{"tier":2}`), []string{"Content-Type", "text/plain"}, 415, "unsupported_media_type", ""},
		{"too large", big, nil, 413, "too_large", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := expectError(t, e.do("POST", "/v1/sessions", e.key, c.body, c.hdr...), c.status, c.code, c.param)
			if c.param != "" && !strings.Contains(msg, c.param) && !strings.Contains(msg, strings.TrimPrefix(c.param, "resources.")) {
				t.Errorf("message does not name %s: %s", c.param, msg)
			}
		})
	}
	if n, _ := e.st.ActiveCount(context.Background(), e.projA); n != 0 {
		t.Fatalf("bad input took %d slots", n)
	}
	page, _ := e.st.List(context.Background(), e.projA, store.ListQuery{})
	if len(page.Sessions) != 0 {
		t.Fatal("bad input persisted a session")
	}
}

func TestListSessions(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := 0; i < 7; i++ {
		eu := "eu_a"
		if i%2 == 1 {
			eu = "eu_b"
		}
		ids = append(ids, e.create(e.key, map[string]any{"tier": 2, "end_user_id": eu, "region": "far"}).ID)
	}
	var got []string
	cursor := ""
	for {
		var page struct {
			Object     string            `json:"object"`
			Data       []session.Session `json:"data"`
			NextCursor *string           `json:"next_cursor"`
		}
		e.mustDo("GET", "/v1/sessions?limit=3&cursor="+cursor, e.key, nil, 200, &page)
		if page.Object != "list" {
			t.Fatal(page.Object)
		}
		for _, s := range page.Data {
			got = append(got, s.ID)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	// Newest first: ids sort by creation time (to the millisecond).
	slices.Sort(ids)
	slices.Reverse(ids)
	if !slices.Equal(got, ids) {
		t.Fatalf("order %v, want %v", got, ids)
	}
	var page struct{ Data []session.Session }
	e.mustDo("GET", "/v1/sessions?end_user_id=eu_b", e.key, nil, 200, &page)
	if len(page.Data) != 3 {
		t.Fatalf("eu_b: %d", len(page.Data))
	}
	e.mustDo("GET", "/v1/sessions?state=pending&limit=100", e.key, nil, 200, &page)
	if len(page.Data) != 7 {
		t.Fatalf("pending: %d", len(page.Data))
	}
	expectError(t, e.do("GET", "/v1/sessions?limit=101", e.key, nil), 400, "invalid_request", "limit")
	expectError(t, e.do("GET", "/v1/sessions?limit=x", e.key, nil), 400, "invalid_request", "limit")
	expectError(t, e.do("GET", "/v1/sessions?state=sleepy", e.key, nil), 400, "invalid_request", "state")
	expectError(t, e.do("GET", "/v1/sessions?cursor=(x", e.key, nil), 400, "invalid_request", "cursor")
	expectError(t, e.do("GET", "/v1/sessions/sess_nope", e.key, nil), 404, "not_found", "")
}

func TestPatchSession(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	var p session.Session
	e.mustDo("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{"max_lifetime_s": 7200, "idle_timeout_s": 600}, 200, &p)
	if p.MaxLifetimeS != 7200 || p.IdleTimeoutS != 600 || !p.ExpiresAt.Equal(s.StartedAt.Add(2*time.Hour)) {
		t.Fatalf("patched %+v", p)
	}
	expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{"max_lifetime_s": 21601}), 400, "invalid_request", "max_lifetime_s")
	expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{"idle_timeout_s": 7201}), 400, "invalid_request", "idle_timeout_s")
	expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{"tier": 3}), 400, "invalid_request", "tier")
	expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{}), 400, "invalid_request", "body")
	expectError(t, e.do("PATCH", "/v1/sessions/sess_nope", e.key, map[string]any{"idle_timeout_s": 60}), 404, "not_found", "")
	e.mustDo("DELETE", "/v1/sessions/"+s.ID, e.key, nil, 202, nil)
	e.waitState(e.key, s.ID, session.Stopped)
	expectError(t, e.do("PATCH", "/v1/sessions/"+s.ID, e.key, map[string]any{"idle_timeout_s": 60}), 409, "invalid_state", "")
}

func TestPauseResumeSnapshot(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	var p session.Session
	e.mustDo("POST", "/v1/sessions/"+s.ID+":pause", e.key, nil, 200, &p)
	if p.State != session.Paused || p.PausedAt == nil {
		t.Fatalf("paused %+v", p)
	}
	msg := expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":pause", e.key, nil), 409, "invalid_state", "")
	if !strings.Contains(msg, "paused") {
		t.Fatalf("409 does not name the state: %s", msg)
	}
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true"}), 409, "invalid_state", "")
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil), 409, "invalid_state", "")
	e.mustDo("POST", "/v1/sessions/"+s.ID+":resume", e.key, nil, 200, &p)
	if p.State != session.Running || p.PausedAt != nil {
		t.Fatalf("resumed %+v", p)
	}
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":resume", e.key, nil), 409, "invalid_state", "")
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":explode", e.key, nil), 404, "no_route", "")
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":pause", e.key, map[string]any{"now": true}), 400, "invalid_request", "now")

	// Tier 1 cannot pause.
	one := e.running(map[string]any{"tier": 1})
	msg = expectError(t, e.do("POST", "/v1/sessions/"+one.ID+":pause", e.key, nil), 409, "invalid_state", "")
	if !strings.Contains(msg, "tier 1") {
		t.Fatalf("tier-1 pause message: %s", msg)
	}

	var snap session.Snapshot
	e.mustDo("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, map[string]any{"include_memory": true}, 201, &snap)
	if snap.State != session.SnapshotReady || !snap.IncludeMemory || snap.SessionID != s.ID || snap.SizeBytes != 4096 {
		t.Fatalf("snapshot %+v", snap)
	}
	if cur := e.waitState(e.key, s.ID, session.Running); cur.State != session.Running {
		t.Fatal("not back to running")
	}
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, map[string]any{"include_memory": "yes"}), 400, "invalid_request", "include_memory")
	var got session.Snapshot
	e.mustDo("GET", "/v1/snapshots/"+snap.ID, e.key, nil, 200, &got)
	if got.ID != snap.ID {
		t.Fatal(got)
	}
	var list struct{ Data []session.Snapshot }
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Fatalf("%d snapshots", len(list.Data))
	}
	restored := e.create(e.key, map[string]any{"tier": 2, "restore_from": snap.ID})
	if restored.ID == s.ID || restored.RestoreFrom == nil || *restored.RestoreFrom != snap.ID || restored.Template != s.Template {
		t.Fatalf("restored %+v", restored)
	}
	e.mustDo("DELETE", "/v1/snapshots/"+snap.ID, e.key, nil, 200, nil)
	expectError(t, e.do("GET", "/v1/snapshots/"+snap.ID, e.key, nil), 404, "not_found", "")
	expectError(t, e.do("DELETE", "/v1/snapshots/"+snap.ID, e.key, nil), 404, "not_found", "")
	expectError(t, e.do("GET", "/v1/snapshots?limit=0", e.key, nil), 400, "invalid_request", "limit")
}

func TestExec(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	var res session.ExecResult
	e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "echo hi; echo err >&2; exit 3"}, 200, &res)
	if res.Stdout != "hi\n" || res.Stderr != "err\n" || res.ExitCode != 3 {
		t.Fatalf("%+v", res)
	}
	e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": []string{"cat"}, "stdin": "in", "env": map[string]string{"A": "1"}}, 200, &res)
	if res.Stdout != "in" {
		t.Fatalf("%+v", res)
	}
	r := e.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "echo streamed"}, 200, nil, "Accept", "application/x-ndjson")
	lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
	if r.header.Get("Content-Type") != "application/x-ndjson" || len(lines) != 2 ||
		lines[0] != `{"stream":"stdout","data":"streamed\n"}` || !strings.Contains(lines[1], `"exit_code":0`) {
		t.Fatalf("stream %q", lines)
	}
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{}), 400, "invalid_request", "command")
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": []int{1}}), 400, "invalid_request", "command")
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true", "timeout_s": 0}), 400, "invalid_request", "timeout_s")
	expectError(t, e.do("POST", "/v1/sessions/"+s.ID+"/exec", e.key, map[string]any{"command": "true", "timeout_s": 3601}), 400, "invalid_request", "timeout_s")
	expectError(t, e.do("POST", "/v1/sessions/sess_nope/exec", e.key, map[string]any{"command": "true"}), 404, "not_found", "")
	got := e.waitState(e.key, s.ID, session.Running)
	if got.LastActivityAt == nil || !got.LastActivityAt.After(s.StartedAt.Time) {
		t.Fatalf("exec did not record activity: %v vs %v", got.LastActivityAt, s.StartedAt)
	}
}

// Every file call is the session's activity, as exec is (seed 000: "Resets on any run, exec,
// filesystem call"): each moves last_activity_at, a missing file's read included.
func TestFileCallsAreActivity(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	last := s.StartedAt.Time
	base := "/v1/sessions/" + s.ID + "/files?path="
	for _, call := range []struct {
		method, path string
		body         any
		status       int
	}{{"PUT", base + "a.txt", []byte("hi"), 204}, {"GET", base + "a.txt", nil, 200},
		{"GET", base + "missing.txt", nil, 404}, {"DELETE", base + "a.txt", nil, 204}} {
		time.Sleep(5 * time.Millisecond) // the store keeps milliseconds
		if r := e.do(call.method, call.path, e.key, call.body); r.status != call.status {
			t.Fatalf("%s %s: HTTP %d %s", call.method, call.path, r.status, r.body)
		}
		var got session.Session
		e.mustDo("GET", "/v1/sessions/"+s.ID, e.key, nil, 200, &got)
		if got.LastActivityAt == nil || !got.LastActivityAt.After(last) {
			t.Fatalf("%s %s did not move last_activity_at: %v, before %v", call.method, call.path, got.LastActivityAt, last)
		}
		last = got.LastActivityAt.Time
	}
}

func TestRuns(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	var run session.Run
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "echo run"}, 201, &run)
	if run.State != session.RunSucceeded || run.Stdout != "run\n" || *run.ExitCode != 0 || run.FinishedAt == nil {
		t.Fatalf("%+v", run)
	}
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "exit 4"}, 201, &run)
	if run.State != session.RunFailed || *run.ExitCode != 4 {
		t.Fatalf("%+v", run)
	}
	e.mustDo("POST", "/v1/runs?wait=false", e.key, map[string]any{"session_id": s.ID, "command": "sleep 0.2; echo late"}, 202, &run)
	if run.State != session.RunQueued {
		t.Fatalf("%+v", run)
	}
	deadline := time.Now().Add(60 * time.Second)
	for run.State != session.RunSucceeded && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		e.mustDo("GET", "/v1/runs/"+run.ID, e.key, nil, 200, &run)
	}
	if run.Stdout != "late\n" {
		t.Fatalf("async run %+v", run)
	}
	// Ephemeral tier-1 run: a fresh session, used once, deleted.
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "python3", "code": "print(6*7)"}, 201, &run)
	if run.State != session.RunSucceeded || run.Stdout != "42\n" {
		t.Fatalf("ephemeral %+v", run)
	}
	eph := e.waitState(e.key, *run.SessionID, session.Stopped)
	if eph.Tier != 1 || eph.ID == s.ID {
		t.Fatalf("ephemeral session %+v", eph)
	}
	// A runtime's family name (as in the CLI's example) is the runtime.
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "python", "code": "print(6*7)"}, 201, &run)
	if run.State != session.RunSucceeded || run.Stdout != "42\n" {
		t.Fatalf("ephemeral run of python: %+v", run)
	}
	msg := expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "cobol", "code": "x"}), 400, "invalid_request", "runtime")
	if !strings.Contains(msg, "python3") {
		t.Fatalf("unknown runtime does not list the available: %s", msg)
	}
	msg = expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "python3.12", "code": "x"}), 400, "invalid_request", "runtime")
	if !strings.Contains(msg, `ask for "python3"`) {
		t.Fatalf("a version of python3 not known: %s", msg)
	}
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"tier": 2, "runtime": "python3", "code": "x"}), 400, "invalid_request", "tier")
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"tier": 1, "runtime": "python3"}), 400, "invalid_request", "code")
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID}), 400, "invalid_request", "command")
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "x", "runtime": "sh"}), 400, "invalid_request", "session_id")
	expectError(t, e.do("POST", "/v1/runs?wait=maybe", e.key, map[string]any{"session_id": s.ID, "command": "x"}), 400, "invalid_request", "wait")
	expectError(t, e.do("POST", "/v1/runs", e.key, map[string]any{"session_id": "sess_nope", "command": "x"}), 404, "not_found", "")
	expectError(t, e.do("GET", "/v1/runs/run_nope", e.key, nil), 404, "not_found", "")
}

func TestWebhookEndpointsAPI(t *testing.T) {
	e := newEnv(t)
	var ep webhooks.Endpoint
	e.mustDo("POST", "/v1/webhook_endpoints", e.key, map[string]any{"url": "http://127.0.0.1:9/hook", "events": []string{"session.running"}}, 201, &ep)
	if !strings.HasPrefix(ep.ID, "whe_") || !strings.HasPrefix(ep.Secret, "whsec_") {
		t.Fatalf("%+v", ep)
	}
	var got webhooks.Endpoint
	e.mustDo("GET", "/v1/webhook_endpoints/"+ep.ID, e.key, nil, 200, &got)
	if got.Secret != "" || got.URL != ep.URL {
		t.Fatalf("GET shows %+v", got)
	}
	var list struct{ Data []webhooks.Endpoint }
	e.mustDo("GET", "/v1/webhook_endpoints", e.key, nil, 200, &list)
	if len(list.Data) != 1 || list.Data[0].Secret != "" {
		t.Fatalf("%+v", list)
	}
	var dl struct{ Data []webhooks.Delivery }
	e.mustDo("GET", "/v1/webhook_endpoints/"+ep.ID+"/deliveries", e.key, nil, 200, &dl)
	expectError(t, e.do("POST", "/v1/webhook_endpoints", e.key, map[string]any{"url": "ftp://x", "events": []string{"session.running"}}), 400, "invalid_request", "url")
	expectError(t, e.do("POST", "/v1/webhook_endpoints", e.key, map[string]any{"url": "http://x", "events": []string{"session.exploded"}}), 400, "invalid_request", "events")
	e.mustDo("DELETE", "/v1/webhook_endpoints/"+ep.ID, e.key, nil, 200, nil)
	expectError(t, e.do("GET", "/v1/webhook_endpoints/"+ep.ID, e.key, nil), 404, "not_found", "")
	expectError(t, e.do("DELETE", "/v1/webhook_endpoints/"+ep.ID, e.key, nil), 404, "not_found", "")
	expectError(t, e.do("GET", "/v1/webhook_endpoints/"+ep.ID+"/deliveries", e.key, nil), 404, "not_found", "")
}

func TestIdempotency(t *testing.T) {
	e := newEnv(t)
	body := map[string]any{"tier": 2, "region": "far"}
	var a, b session.Session
	e.mustDo("POST", "/v1/sessions", e.key, body, 201, &a, "Idempotency-Key", "k1")
	r := e.mustDo("POST", "/v1/sessions", e.key, body, 201, &b, "Idempotency-Key", "k1")
	if a.ID != b.ID || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay gave %s, first %s", b.ID, a.ID)
	}
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 3}, "Idempotency-Key", "k1"), 409, "idempotency_key_reused", "")
	// Another project may use the same key.
	_, keyB := e.newProject("B", nil)
	e.mustDo("POST", "/v1/sessions", keyB, body, 201, &b, "Idempotency-Key", "k1")
	if b.ID == a.ID {
		t.Fatal("idempotency keys shared across projects")
	}
	// A 4xx is remembered too; a new key makes a new session.
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 9}, "Idempotency-Key", "k2"), 400, "invalid_request", "tier")
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 9}, "Idempotency-Key", "k2"), 400, "invalid_request", "tier")
	e.mustDo("POST", "/v1/sessions", e.key, body, 201, &b, "Idempotency-Key", "k3")
	if b.ID == a.ID {
		t.Fatal("new key replayed")
	}
	expectError(t, e.do("POST", "/v1/sessions", e.key, body, "Idempotency-Key", strings.Repeat("k", 256)), 400, "invalid_request", "Idempotency-Key")
}

// TestIdempotencyGatewayDied: a gateway killed holding an Idempotency-Key (its claim made,
// its lease no longer renewed) leaves the key to a retry once the lease lapses, and the
// retry answers the one session of that key: the one the dead gateway made, when it got that
// far, or a new one, never a second. Before leases the key answered 409 "in progress" for
// its whole 24 h, and a retry that took it over would have made a second session.
func TestIdempotencyGatewayDied(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	proj, err := e.st.GetProject(ctx, e.projA)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 3 * time.Second
	dead := store.New(e.rdb, store.WithIdemLease(lease)) // the killed gateway's store
	body := []byte(`{"tier":2,"region":"far"}`)
	fp := fingerprint(httptest.NewRequest("POST", "/v1/sessions", nil), body)
	ids := func() []string {
		var list struct{ Data []session.Session }
		e.mustDo("GET", "/v1/sessions?limit=100", e.key, nil, 200, &list)
		var out []string
		for _, s := range list.Data {
			out = append(out, s.ID)
		}
		return out
	}
	// Both cases' keys are claimed first, so that one wait outlasts both leases.
	made := map[bool]string{}
	for _, wrote := range []bool{true, false} {
		key := fmt.Sprintf("died-wrote-%v", wrote)
		_, claim, err := dead.IdemBegin(ctx, e.projA, key, fp)
		if err != nil || claim == nil {
			t.Fatalf("%s: the dead gateway's claim: %v", key, err)
		}
		if wrote { // killed after its write, before its answer was recorded
			var req session.CreateRequest
			if err := json.Unmarshal(body, &req); err != nil {
				t.Fatal(err)
			}
			sess, _, err := e.gw.admitRequest(ctx, proj, req, "sess_"+claim.Ref, nil)
			if err != nil {
				t.Fatal(err)
			}
			made[wrote] = sess.ID
		}
		// Within the lease the key is held: 409, which a client retries.
		expectError(t, e.do("POST", "/v1/sessions", e.key, body, "Idempotency-Key", key), 409, "idempotency_key_reused", "")
	}
	time.Sleep(lease + 500*time.Millisecond)
	for _, wrote := range []bool{true, false} {
		key := fmt.Sprintf("died-wrote-%v", wrote)
		made := made[wrote]
		before := ids()
		var got session.Session
		e.mustDo("POST", "/v1/sessions", e.key, body, 201, &got, "Idempotency-Key", key)
		if made != "" && got.ID != made {
			t.Fatalf("%s: the retry answered %s, a second session besides the dead gateway's %s", key, got.ID, made)
		}
		after := ids()
		if want := len(before) + 1; wrote {
			want = len(before)
			if len(after) != want {
				t.Fatalf("%s: %d sessions after the retry, want %d (the dead gateway's only): %v", key, len(after), want, after)
			}
		} else if len(after) != want || !slices.Contains(after, got.ID) {
			t.Fatalf("%s: sessions %v after the retry, want %v and its %s", key, after, before, got.ID)
		}
		var again session.Session
		r := e.mustDo("POST", "/v1/sessions", e.key, body, 201, &again, "Idempotency-Key", key)
		if again.ID != got.ID || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: the next retry answered %s (replayed %q), want %s", key, again.ID, r.header.Get("Idempotent-Replayed"), got.ID)
		}
	}
}

// TestIdempotencyTakenOverAndRefused: a request that took an Idempotency-Key over from a dead
// gateway's claim, and was then refused with a 429 (the project at its concurrency), keeps
// the key's ref: the dead gateway's write may still land under it, and the next retry must
// answer that session, not make a second. Before, the 429 forgot the key, and the next retry
// took a new ref and made a second session for one request.
func TestIdempotencyTakenOverAndRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	one := 1
	projC, keyC := e.newProject("C", &one)
	proj, err := e.st.GetProject(ctx, projC)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 2 * time.Second
	dead := store.New(e.rdb, store.WithIdemLease(lease)) // the killed gateway's store
	body := []byte(`{"tier":2,"region":"far"}`)
	fp := fingerprint(httptest.NewRequest("POST", "/v1/sessions", nil), body)
	_, claim, err := dead.IdemBegin(ctx, projC, "taken-over", fp)
	if err != nil || claim == nil {
		t.Fatalf("the dead gateway's claim: %v", err)
	}
	blocker := e.create(keyC, map[string]any{"tier": 2, "region": "far"}) // the project's one slot
	time.Sleep(lease + 500*time.Millisecond)
	expectError(t, e.do("POST", "/v1/sessions", keyC, body, "Idempotency-Key", "taken-over"), 429, "concurrency_limit", "")
	e.mustDo("DELETE", "/v1/sessions/"+blocker.ID, keyC, nil, 200, nil)
	// The dead gateway's write lands late, under the ref it claimed.
	var req session.CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	late, _, err := e.gw.admitRequest(ctx, proj, req, "sess_"+claim.Ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got session.Session
	e.mustDo("POST", "/v1/sessions", keyC, body, 201, &got, "Idempotency-Key", "taken-over")
	if got.ID != late.ID {
		t.Fatalf("the retry after the refusal answered %s, a second session besides the late write's %s", got.ID, late.ID)
	}
}

func TestLimits(t *testing.T) {
	e := newEnv(t)
	one := 1
	projC, keyC := e.newProject("C", &one)
	e.create(keyC, map[string]any{"tier": 2, "region": "far"})
	r := e.do("POST", "/v1/sessions", keyC, map[string]any{"tier": 2, "region": "far"})
	expectError(t, r, 429, "concurrency_limit", "")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	if err := e.st.SetRate(context.Background(), projC, 1, 1); err != nil {
		t.Fatal(err)
	}
	// SetRate returns once the gateway has dropped the project it kept (store.Changes).
	// One token a second: of a few quick requests, one at least is over the rate (a slow
	// machine may refill a token between two of them, so no single one is certain).
	for i := 0; i < 5; i++ {
		if r = e.do("POST", "/v1/sessions", keyC, map[string]any{"tier": 2}); r.status == 429 && strings.Contains(string(r.body), `"code":"rate_limited"`) {
			break
		}
	}
	expectError(t, r, 429, "rate_limited", "")
	if r.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
}

type denyTier4 struct{}

func (denyTier4) Admit(_ context.Context, in session.AdmissionInput) (session.Decision, error) {
	if *in.Request.Tier == 4 {
		return session.Decision{Allow: false, Reasons: []string{"tier 4 needs a plan"}, Decider: "test"}, nil
	}
	if in.Request.EndUserID == "eu_warn" {
		return session.Decision{Allow: true, Warnings: []string{"close to the cap"}, Patch: map[string]any{"idle_timeout_s": 60}}, nil
	}
	return session.Decision{Allow: true}, nil
}

func TestAdmissionDecision(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Admitter = denyTier4{} })
	msg := expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 4}), 403, "denied", "")
	if msg != "tier 4 needs a plan" {
		t.Fatal(msg)
	}
	var s session.Session
	r := e.mustDo("POST", "/v1/sessions", e.key, map[string]any{"tier": 2, "end_user_id": "eu_warn"}, 201, &s)
	if !strings.Contains(r.header.Get("Warning"), "close to the cap") || s.IdleTimeoutS != 60 {
		t.Fatalf("warning %q idle %d", r.header.Get("Warning"), s.IdleTimeoutS)
	}
}

func TestTemplatesMetricsOpenAPI(t *testing.T) {
	e := newEnv(t)
	var list struct {
		Data []struct {
			Name     string            `json:"name"`
			Ref      string            `json:"ref"`
			Runtimes []string          `json:"runtimes"`
			Versions map[string]string `json:"runtime_versions"`
		}
	}
	e.mustDo("GET", "/v1/templates", e.key, nil, 200, &list)
	if len(list.Data) != 2 || list.Data[1].Ref != "tpl_dev_polyglot@sha256:bbbb" || list.Data[1].Runtimes[0] != "python3" ||
		list.Data[1].Versions["python3"] != "3.11.2" || list.Data[0].Versions != nil {
		t.Fatalf("%+v", list)
	}
	e.running(map[string]any{"tier": 2})
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 0}), 400, "invalid_request", "tier")
	e.do("GET", "/v1/no/such/route", e.key, nil)
	r := e.do("GET", "/metrics", adminKey, nil)
	for _, want := range []string{
		`wb_http_requests_total{method="POST",route="POST /v1/sessions",status="201"} 1`,
		`wb_http_requests_total{method="POST",route="POST /v1/sessions",status="400"} 1`,
		`wb_http_requests_total{method="GET",route="unmatched",status="404"} 1`, // not by its path
		`wb_http_request_duration_seconds_bucket{method="GET",route="GET /v1/sessions/{id}",status="200"`,
		`wb_admission_decisions_total{decision="allow"} 1`,
		`wb_admission_decisions_total{decision="invalid"} 1`,
		`wb_sessions{state="running"} 1`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	r = e.do("GET", "/v1/openapi.json", "", nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"openapi"`) {
		t.Fatalf("openapi: %d", r.status)
	}
}

// Project B cannot read, list, change, exec into, snapshot or delete project A's objects,
// and receives none of A's events on its webhooks.
func TestTwoTenants(t *testing.T) {
	e := newEnv(t)
	_, keyB := e.newProject("B", nil)
	hits := make(chan string, 100)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		hits <- string(b)
	}))
	defer recv.Close()
	var epB webhooks.Endpoint
	e.mustDo("POST", "/v1/webhook_endpoints", keyB, map[string]any{"url": recv.URL, "events": []string{"*"}}, 201, &epB)
	ctx, cancel := context.WithCancel(context.Background())
	disp := webhooks.NewDispatcher(e.rdb, e.gw.Webhooks, webhooks.Options{})
	done := make(chan struct{})
	go func() { _ = disp.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	s := e.running(map[string]any{"tier": 2})
	var snap session.Snapshot
	e.mustDo("POST", "/v1/sessions/"+s.ID+":snapshot", e.key, nil, 201, &snap)
	var run session.Run
	e.mustDo("POST", "/v1/runs", e.key, map[string]any{"session_id": s.ID, "command": "true"}, 201, &run)
	var epA webhooks.Endpoint
	e.mustDo("POST", "/v1/webhook_endpoints", e.key, map[string]any{"url": recv.URL + "/a", "events": []string{"session.paused"}}, 201, &epA)

	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/sessions/" + s.ID, nil},
		{"PATCH", "/v1/sessions/" + s.ID, map[string]any{"idle_timeout_s": 60}},
		{"DELETE", "/v1/sessions/" + s.ID, nil},
		{"POST", "/v1/sessions/" + s.ID + ":pause", nil},
		{"POST", "/v1/sessions/" + s.ID + ":snapshot", nil},
		{"POST", "/v1/sessions/" + s.ID + "/exec", map[string]any{"command": "true"}},
		{"POST", "/v1/runs", map[string]any{"session_id": s.ID, "command": "true"}},
		{"GET", "/v1/snapshots/" + snap.ID, nil},
		{"DELETE", "/v1/snapshots/" + snap.ID, nil},
		{"GET", "/v1/runs/" + run.ID, nil},
		{"GET", "/v1/webhook_endpoints/" + epA.ID, nil},
		{"DELETE", "/v1/webhook_endpoints/" + epA.ID, nil},
		{"GET", "/v1/webhook_endpoints/" + epA.ID + "/deliveries", nil},
	} {
		expectError(t, e.do(c.method, c.path, keyB, c.body), 404, "not_found", "")
	}
	for _, path := range []string{"/v1/sessions", "/v1/snapshots", "/v1/webhook_endpoints"} {
		var list struct{ Data []json.RawMessage }
		e.mustDo("GET", path, keyB, nil, 200, &list)
		if len(list.Data) != 1 && path == "/v1/webhook_endpoints" || len(list.Data) != 0 && path != "/v1/webhook_endpoints" {
			t.Errorf("B lists %d on %s", len(list.Data), path)
		}
	}
	// A's session is untouched by all of that.
	if got := e.waitState(e.key, s.ID, session.Running); got.IdleTimeoutS != 300 {
		t.Fatal("B changed A's session")
	}
	// B's own session's events reach B; none of A's do.
	sb := e.create(keyB, map[string]any{"tier": 2})
	e.waitState(keyB, sb.ID, session.Running)
	deadline := time.After(60 * time.Second)
	sawB := false
	for !sawB {
		select {
		case h := <-hits:
			if strings.Contains(h, s.ID) || strings.Contains(h, e.projA) || strings.Contains(h, snap.ID) {
				t.Fatalf("B received A's event: %s", h)
			}
			sawB = strings.Contains(h, sb.ID) && strings.Contains(h, `"session.running"`)
		case <-deadline:
			t.Fatal("B's own events never arrived")
		}
	}
	for {
		select {
		case h := <-hits:
			if strings.Contains(h, s.ID) {
				t.Fatalf("B received A's event: %s", h)
			}
		case <-time.After(300 * time.Millisecond): // the point: a quiet spell with none of A's events
			return
		}
	}
}

func TestDeleteWhileProvisioning(t *testing.T) {
	e := newEnv(t)
	e.node.Hang = true
	s := e.create(e.key, map[string]any{"tier": 2})
	e.waitState(e.key, s.ID, session.Provisioning)
	var del session.Session
	e.mustDo("DELETE", "/v1/sessions/"+s.ID, e.key, nil, 202, &del)
	if del.State != session.Stopping {
		t.Fatal(del.State)
	}
	e.waitState(e.key, s.ID, session.Stopped)
}

// TestEnvNodeOutlivesTheHeartbeatTimeout: the tests' fake node heartbeats as a real node does,
// so a session created past the placer's heartbeat timeout (10 s) is placed. A loaded machine
// stretched TestConnectURLs past it, and its sessions stayed pending.
func TestEnvNodeOutlivesTheHeartbeatTimeout(t *testing.T) {
	e := newEnv(t)
	time.Sleep(11 * time.Second)
	e.running(map[string]any{"tier": 2})
}

// TestOpenAPIStalledCallerIsCut: the OpenAPI document (240 KB, to any caller, without a key)
// asked for many times on one connection whose caller takes none of it ends once a write
// waited WriteStall, and the connection is closed. Before, such a caller held a handler and
// its connection for as long as it stayed, as many times as it opened connections.
func TestOpenAPIStalledCallerIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	// Enough, pipelined, to fill every buffer on the way.
	stalledConnCloses(t, e.gw.Handler(), "", "/v1/openapi.json", 60)
}

// TestConsoleAndMetricsStalledCallerIsCut: the web console's files (to anyone, without a key,
// some past net/http's 4 KiB buffer) and /metrics (the operator's) asked for many times on one
// connection whose caller takes none of them end once a write waited WriteStall, and the
// connection is closed, as the OpenAPI document's do.
func TestConsoleAndMetricsStalledCallerIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	t.Run("console", func(t *testing.T) { stalledConnCloses(t, e.gw.Handler(), "", console.Prefix+"/desktop.js", 2000) })
	t.Run("metrics", func(t *testing.T) {
		// Series of a few routes, as any gateway soon has: an answer of tens of kilobytes.
		for _, path := range []string{"/healthz", "/v1/sessions", "/v1/snapshots", "/v1/desktops", "/v1/policies",
			"/v1/plugins", "/v1/templates", "/v1/usage", "/v1/webhooks/endpoints", "/v1/sessions/sess_nope", "/v1/runs/run_nope"} {
			e.do("GET", path, e.key, nil)
			e.do("GET", path, "wb_live_nope", nil)
		}
		stalledConnCloses(t, e.gw.Handler(), adminKey, "/metrics", 500)
	})
}

// TestSmallAnswersStalledCallerIsCut: a small answer (the health check's), asked for so many
// times on one connection that its caller, who takes none of them, fills the connection, ends
// within WriteStall of its handler's return, and the connection is closed. Before, net/http's
// own last write of the answer, made once the handler returned and so outside every bound
// of the gateway's, held the connection for as long as the caller stayed.
func TestSmallAnswersStalledCallerIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	stalledConnCloses(t, e.gw.Handler(), "", "/healthz", 20000)
}

// stalledConnCloses sends n GETs of path with key on one connection to a server of h, reads
// no more than the first answer's status line, and fails unless the server closes the
// connection within 45 s (WriteStall ends the answer it stalled in).
func stalledConnCloses(t *testing.T, h http.Handler, key, path string, n int) {
	t.Helper()
	closed := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnContext = stallwrite.ConnContext // as wb serve's
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	stalledCall(t, srv.Listener.Addr().String(), key, "GET", path, "", "", n)
	select {
	case <-closed:
	case <-time.After(45 * time.Second):
		t.Fatalf("45 s after its caller stopped reading, the connection asking for %s was still open; want it closed after the stall", path)
	}
}

// TestSessionListStalledCallerIsCut: the list of sessions (a page is up to 100 sessions, each
// with up to 50 metadata entries: megabytes) ends once a write to a caller that takes none
// of it waited WriteStall, and the connection is closed. Before, such a caller (asking for a
// few pages on one connection) held the handler and the page for as long as it stayed.
func TestSessionListStalledCallerIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	meta := map[string]string{}
	for i := range 20 {
		meta[fmt.Sprintf("k%d", i)] = strings.Repeat("v", 200)
	}
	for range 10 {
		e.running(map[string]any{"tier": 2, "metadata": meta})
	}
	stalledConnCloses(t, e.gw.Handler(), e.key, "/v1/sessions?limit=100", 100)
}

// TestObjectListsStalledCallerIsCut: a page of the project's desktops or snapshots (up to 100
// of them: tens of kilobytes) asked for many times on one connection whose caller takes none
// of it ends once a write waited WriteStall, and the connection is closed, as the sessions'
// list does. Before, such a caller held the handler and the page for as long as it stayed.
func TestObjectListsStalledCallerIsCut(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WriteStall = 3 * time.Second })
	ctx := context.Background()
	for range store.MaxListLimit {
		now := time.Now()
		rec := desktop.Record{Desktop: desktop.Desktop{ID: session.NewID(desktop.IDPrefix, now), Object: desktop.ObjectName, ProjectID: e.projA,
			Name: strings.Repeat("d", desktop.MaxNameLen), Size: "s", State: desktop.Stopped, MCPURL: e.url + "/v1/desktops/x/mcp", CreatedAt: *session.At(now)}}
		if _, err := e.st.PutDesktop(ctx, rec, ""); err != nil {
			t.Fatal(err)
		}
		snap := session.SnapshotRecord{Snapshot: session.Snapshot{ID: session.NewID("snap_", now), Object: "snapshot", SessionID: session.NewID("sess_", now),
			State: session.SnapshotReady, SizeBytes: 1 << 30, CreatedAt: *session.At(now), Template: "tpl_base", Tier: 2}}
		if err := e.st.PutObject(ctx, e.projA, store.KindSnapshot, snap.ID, snap); err != nil {
			t.Fatal(err)
		}
	}
	for _, path := range []string{"/v1/desktops?limit=100", "/v1/snapshots?limit=100"} {
		t.Run(path, func(t *testing.T) { stalledConnCloses(t, e.gw.Handler(), e.key, path, 100) })
	}
}

// TestPolicyListStalledCallerIsCut: the list of a project's policies (up to 64: tens of
// kilobytes, past net/http's buffer, so the handler itself writes to the socket) asked for
// many times on one connection whose caller takes none of it ends once a write waited
// WriteStall, and the connection is closed. Before, such a caller held the handler for as
// long as it stayed.
func TestPolicyListStalledCallerIsCut(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, withDecisionPoints(t, rdb), func(c *Config) { c.WriteStall = 3 * time.Second })
	for i := range policies.DefaultMaxPolicies {
		if r := e.putPolicy(e.key, fmt.Sprintf("p%02d", i), "enforce", "package wb.admission\n"); r.status != 201 {
			t.Fatalf("upload %d: %d %s", i, r.status, r.body)
		}
	}
	stalledConnCloses(t, e.gw.Handler(), e.key, "/v1/policies", 100)
}
