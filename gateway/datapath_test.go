package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"wb/internal/edgeauth"
	"wb/session"
	"wb/store"
)

// dataPathEnv is a gateway env plus a data path over the same fake node, as that node would
// serve it to the edge.
type dataPathEnv struct {
	*env
	edge   *env // the env's helpers, aimed at the data path's server
	signer *edgeauth.Signer
	nodeID string
}

func newDataPathEnv(t *testing.T, opts ...func(*DataPathConfig)) *dataPathEnv {
	t.Helper()
	e := newEnv(t)
	fallback := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Fallback", "node api")
		w.WriteHeader(http.StatusTeapot)
	})
	cfg := DataPathConfig{Store: e.st, Guests: e.node, NodeID: e.node.Info.ID, Fallback: fallback}
	for _, o := range opts {
		o(&cfg)
	}
	dp, err := NewDataPath(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(dp.Handler())
	t.Cleanup(func() { srv.Close(); dp.Close() })
	secret, err := e.st.EdgeSecret(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	signer, err := edgeauth.NewSigner(secret, edgeauth.PurposeEdge)
	if err != nil {
		t.Fatal(err)
	}
	edge := *e
	edge.url = srv.URL
	return &dataPathEnv{env: e, edge: &edge, signer: signer, nodeID: e.node.Info.ID}
}

// grant is what ext_authz would sign for s on this node, valid for a minute.
func (d *dataPathEnv) grant(s session.Session) string {
	return d.signer.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: s.ProjectID, NodeID: d.nodeID, Expires: time.Now().Add(time.Minute).Unix()})
}

// TestDataPathServesTheAPIsHandlers: with a grant, exec (buffered and streamed), files and a
// PTY answer on the data path exactly as through the API (every answer is checked against
// openapi.json by env.do), and count as activity.
func TestDataPathServesTheAPIsHandlers(t *testing.T) {
	d := newDataPathEnv(t)
	s := d.running(map[string]any{"tier": 2})
	g := d.grant(s)
	exec := "/v1/sessions/" + s.ID + "/exec"

	var viaEdge, viaAPI session.ExecResult
	body := map[string]any{"command": "echo hi; echo err >&2; exit 3"}
	d.edge.mustDo("POST", exec, "", body, 200, &viaEdge, edgeauth.HeaderEdgeAuth, g)
	d.mustDo("POST", exec, d.key, body, 200, &viaAPI)
	viaEdge.DurationMs, viaAPI.DurationMs = 0, 0
	if viaEdge != viaAPI || viaEdge.Stdout != "hi\n" || viaEdge.ExitCode != 3 {
		t.Fatalf("exec on the data path %+v, through the API %+v", viaEdge, viaAPI)
	}
	r := d.edge.mustDo("POST", exec, "", map[string]any{"command": "echo streamed"}, 200, nil, "Accept", "application/x-ndjson", edgeauth.HeaderEdgeAuth, g)
	lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
	if r.header.Get("Content-Type") != "application/x-ndjson" || len(lines) != 2 ||
		lines[0] != `{"stream":"stdout","data":"streamed\n"}` || !strings.Contains(lines[1], `"exit_code":0`) {
		t.Fatalf("stream %q", lines)
	}
	expectError(t, d.edge.do("POST", exec, "", map[string]any{}, edgeauth.HeaderEdgeAuth, g), 400, "invalid_request", "command")

	files := "/v1/sessions/" + s.ID + "/files?path="
	d.edge.mustDo("PUT", files+"a.txt", "", []byte("edge bytes"), 204, nil, edgeauth.HeaderEdgeAuth, g)
	if got := d.edge.mustDo("GET", files+"a.txt", "", nil, 200, nil, edgeauth.HeaderEdgeAuth, g); string(got.body) != "edge bytes" {
		t.Fatalf("GET on the data path: %q", got.body)
	}
	if got := d.mustDo("GET", files+"a.txt", d.key, nil, 200, nil); string(got.body) != "edge bytes" {
		t.Fatalf("GET through the API of the file the data path wrote: %q", got.body)
	}
	list := d.edge.mustDo("GET", files+".&list=1", "", nil, 200, nil, edgeauth.HeaderEdgeAuth, g)
	if !strings.Contains(string(list.body), `"a.txt"`) {
		t.Fatalf("list: %s", list.body)
	}
	d.edge.mustDo("DELETE", files+"a.txt", "", nil, 204, nil, edgeauth.HeaderEdgeAuth, g)
	expectError(t, d.edge.do("GET", files+"a.txt", "", nil, edgeauth.HeaderEdgeAuth, g), 404, "not_found", "")
	expectError(t, d.edge.do("GET", "/v1/sessions/"+s.ID+"/files", "", nil, edgeauth.HeaderEdgeAuth, g), 400, "invalid_request", "path")

	before := len(d.node.Calls())
	u := "ws" + strings.TrimPrefix(d.edge.url, "http") + "/v1/sessions/" + s.ID + "/pty?command=cat"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{edgeauth.HeaderEdgeAuth: {g}}})
	if err != nil {
		t.Fatalf("PTY on the data path: %v", err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("ping-through-edge\n")); err != nil {
		t.Fatal(err)
	}
	var seen string
	for !strings.Contains(seen, "ping-through-edge") {
		_, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("PTY read after %q: %v", seen, err)
		}
		seen += string(b)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	if !slices.Contains(d.node.Calls()[before:], "touch:"+s.ID) {
		t.Fatalf("a PTY frame on the data path did not touch the session: %v", d.node.Calls()[before:])
	}
	got := d.waitState(d.key, s.ID, session.Running)
	if got.LastActivityAt == nil || !got.LastActivityAt.After(s.StartedAt.Time) {
		t.Fatalf("the data path's exec did not record activity: %v vs %v", got.LastActivityAt, s.StartedAt)
	}
}

// TestDataPathMetrics: the data path's requests are counted by route, method and status in
// the registry it is given (a node's, which serves it on --metrics-addr), beside what the
// registry had: no name is taken twice. Before, the data path kept them in a registry of its
// own that nothing served.
func TestDataPathMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d := newDataPathEnv(t, func(c *DataPathConfig) { c.Registry = reg })
	s := d.running(map[string]any{"tier": 2})
	exec := "/v1/sessions/" + s.ID + "/exec"
	d.edge.mustDo("POST", exec, "", map[string]any{"command": "true"}, 200, nil, edgeauth.HeaderEdgeAuth, d.grant(s))
	if r := d.edge.do("POST", exec, "", map[string]any{"command": "true"}); r.status != 401 {
		t.Fatalf("an exec on the data path without a grant: %d %s", r.status, r.body)
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	got := grepLines(rec.Body.String(), "wb_http_request")
	for _, want := range []string{
		`wb_http_requests_total{method="POST",route="POST /v1/sessions/{id}/exec",status="200"} 1`,
		`wb_http_requests_total{method="POST",route="POST /v1/sessions/{id}/exec",status="401"} 1`,
		`wb_http_request_duration_seconds_count{method="POST",route="POST /v1/sessions/{id}/exec",status="200"} 1`,
	} {
		if !strings.Contains(got+"\n", want+"\n") {
			t.Errorf("the registry given to the data path lacks %s; it has:\n%s", want, got)
		}
	}
}

// TestDataPathRefusals: without a valid grant for this session on this node, the data path
// answers 401 and nothing reaches the guest; a valid grant for a session that is not
// there or not running answers as the API does (404, 409).
func TestDataPathRefusals(t *testing.T) {
	d := newDataPathEnv(t)
	s := d.running(map[string]any{"tier": 2})
	other := d.running(map[string]any{"tier": 2})
	exp := time.Now().Add(time.Minute).Unix()
	sign := func(g edgeauth.Grant) string { return d.signer.Sign(g) }
	connect, _ := edgeauth.NewSigner(mustSecret(t, d.env), edgeauth.PurposeConnect)
	forS := edgeauth.Grant{SessionID: s.ID, ProjectID: s.ProjectID, NodeID: d.nodeID, Expires: exp}
	withNode := func(n string) edgeauth.Grant { g := forS; g.NodeID = n; return g }
	expired := forS
	expired.Expires = time.Now().Add(-time.Second).Unix()
	valid := sign(forS)
	mark := map[string]any{"command": "echo reached > marker"}
	exec := "/v1/sessions/" + s.ID + "/exec"
	before := len(d.node.Calls())

	for _, c := range []struct {
		name   string
		hdr    []string
		status int
		code   string
		says   string
	}{
		{"no grant", nil, 401, "unauthenticated", edgeauth.HeaderEdgeAuth},
		{"an API key instead", []string{"Authorization", "Bearer " + d.key}, 401, "unauthenticated", "the edge"},
		{"garbage", []string{edgeauth.HeaderEdgeAuth, "v1.garbage.x"}, 401, "unauthenticated", "invalid grant"},
		{"expired", []string{edgeauth.HeaderEdgeAuth, sign(expired)}, 401, "unauthenticated", "expired"},
		{"a connect token", []string{edgeauth.HeaderEdgeAuth, connect.Sign(forS)}, 401, "unauthenticated", "bad signature"},
		{"another session's", []string{edgeauth.HeaderEdgeAuth, d.grant(other)}, 401, "unauthenticated", other.ID},
		{"another node's", []string{edgeauth.HeaderEdgeAuth, sign(withNode("node_elsewhere"))}, 401, "unauthenticated", "node_elsewhere"},
		{"no node", []string{edgeauth.HeaderEdgeAuth, sign(withNode(""))}, 401, "unauthenticated", "not this node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := expectError(t, d.edge.do("POST", exec, "", mark, c.hdr...), c.status, c.code, edgeauth.HeaderEdgeAuth)
			if !strings.Contains(msg, c.says) {
				t.Errorf("message %q does not say %q", msg, c.says)
			}
			expectError(t, d.edge.do("PUT", "/v1/sessions/"+s.ID+"/files?path=marker", "", []byte("reached"), c.hdr...), c.status, c.code, "*")
			expectError(t, d.edge.do("GET", "/v1/sessions/"+s.ID+"/pty", "", nil, c.hdr...), c.status, c.code, "*")
		})
	}
	// Two grants: which one would count is ambiguous, so neither does.
	req, _ := http.NewRequest("POST", d.edge.url+exec, strings.NewReader(`{"command":"true"}`))
	req.Header.Add(edgeauth.HeaderEdgeAuth, valid)
	req.Header.Add(edgeauth.HeaderEdgeAuth, d.grant(other))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("two grants: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if calls := d.node.Calls()[before:]; len(calls) != 0 {
		t.Fatalf("refused requests reached the node: %v", calls)
	}
	expectError(t, d.edge.do("GET", "/v1/sessions/"+s.ID+"/files?path=marker", "", nil, edgeauth.HeaderEdgeAuth, valid), 404, "not_found", "")

	// A grant of another project for this session id: the session is not in that project.
	foreign := forS
	foreign.ProjectID = "proj_other"
	expectError(t, d.edge.do("POST", exec, "", mark, edgeauth.HeaderEdgeAuth, sign(foreign)), 404, "not_found", "")
	// A grant for a session that does not exist.
	nope := forS
	nope.SessionID = "sess_nope"
	expectError(t, d.edge.do("POST", "/v1/sessions/sess_nope/exec", "", mark, edgeauth.HeaderEdgeAuth, sign(nope)), 404, "not_found", "")
	// A session that ended: a grant signed before its end still opens nothing.
	d.mustDo("DELETE", "/v1/sessions/"+other.ID, d.key, nil, 202, nil)
	d.waitState(d.key, other.ID, session.Stopped)
	msg := expectError(t, d.edge.do("POST", "/v1/sessions/"+other.ID+"/exec", "", mark, edgeauth.HeaderEdgeAuth, d.grant(other)), 409, "invalid_state", "")
	if !strings.Contains(msg, "stopped") {
		t.Fatalf("exec in an ended session: %q does not name its state", msg)
	}
	expectError(t, d.edge.do("GET", "/v1/sessions/"+other.ID+"/files?path=x", "", nil, edgeauth.HeaderEdgeAuth, d.grant(other)), 409, "invalid_state", "")

	// Every other route is the node's own API.
	resp, err := http.Get(d.edge.url + "/v1/sessions/" + s.ID + "/agent/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || resp.Header.Get("X-Fallback") != "node api" {
		t.Fatalf("another route: %d %v, want the fallback's answer", resp.StatusCode, resp.Header)
	}
}

// TestDataPathConnectToken: a request that ext_authz let through by its connect token
// reaches the node's data path as it reaches the gateway's handlers: without the token (an
// Idempotency-Key exec retried through a fresher connect URL replays the first answer) and
// marked as a token request (a PTY opens from a page of another origin). A request the edge
// let through by API key still gets the same-origin check.
func TestDataPathConnectToken(t *testing.T) {
	d := newDataPathEnv(t)
	az := authzClient(t, d.env)
	s := d.running(map[string]any{"tier": 2})
	base := "/v1/sessions/" + s.ID
	// edgeGrant is the grant ext_authz adds to the request for target.
	edgeGrant := func(method, target string, headers map[string]string) string {
		t.Helper()
		g := allowed(t, check(t, az, method, target, headers))[edgeauth.HeaderEdgeAuth]
		if g == "" {
			t.Fatalf("ext_authz allowed %s %s without a grant", method, target)
		}
		return g
	}
	connect := edgeSigner(t, d.st, edgeauth.PurposeConnect)
	token := func(ttl time.Duration) string {
		return connect.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: s.ProjectID, Expires: time.Now().Add(ttl).Unix()})
	}
	tok, later := token(5*time.Minute), token(10*time.Minute)

	body := map[string]any{"command": "echo $$"}
	exec := func(tok string) response {
		target := base + "/exec?token=" + tok
		return d.edge.do("POST", target, "", body, "Idempotency-Key", "edge-k1", edgeauth.HeaderEdgeAuth, edgeGrant("POST", target, nil))
	}
	first, again := exec(tok), exec(later)
	if first.status != 200 || again.status != 200 || again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) {
		t.Errorf("retry through a fresher connect URL on the data path: %d then %d replayed %q, %s vs %s",
			first.status, again.status, again.header.Get("Idempotent-Replayed"), first.body, again.body)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(d.edge.url, "http")
	target := base + "/pty?token=" + tok
	conn, resp, err := websocket.Dial(ctx, ws+target, &websocket.DialOptions{HTTPHeader: http.Header{
		"Origin": {"https://app.example"}, edgeauth.HeaderEdgeAuth: {edgeGrant("GET", target, nil)}}})
	if err != nil {
		t.Fatalf("PTY by connect token from another origin on the data path: %v (HTTP %v)", err, resp)
	}
	conn.CloseNow()
	_, resp, err = websocket.Dial(ctx, ws+base+"/pty", &websocket.DialOptions{HTTPHeader: http.Header{
		"Origin": {"https://app.example"}, edgeauth.HeaderEdgeAuth: {edgeGrant("GET", base+"/pty", bearer(d.key))}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("PTY by key from another origin on the data path: %v (HTTP %v), want 403", err, resp)
	}
}

func mustSecret(t *testing.T, e *env) []byte {
	t.Helper()
	b, err := e.st.EdgeSecret(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDataPathHeaderValues: no value of the grant header panics the data path or passes it.
func TestDataPathHeaderValues(t *testing.T) {
	d := newDataPathEnv(t)
	dp, err := NewDataPath(DataPathConfig{Store: d.st, Guests: d.node, NodeID: d.nodeID})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	h := dp.Handler()
	valid := d.signer.Sign(edgeauth.Grant{SessionID: "sess_x", ProjectID: "p", NodeID: d.nodeID, Expires: time.Now().Add(time.Minute).Unix()})
	parts := strings.Split(valid, ".")
	for _, v := range []string{"", " ", "v1", "v1..", "v1." + parts[1], "v1." + parts[1] + ".", "v2." + parts[1] + "." + parts[2],
		valid + "x", "x" + valid, strings.Repeat("v1.", 4000), "\x00\xff\xfe", "v1.\u00e9.\u00e9", "v1.e30." + parts[2],
		"v1." + strings.Repeat("A", 3000) + "." + parts[2], strings.ToUpper(valid)} {
		req := httptest.NewRequest("POST", "/v1/sessions/sess_x/exec", strings.NewReader(`{"command":"true"}`))
		req.Header[http.CanonicalHeaderKey(edgeauth.HeaderEdgeAuth)] = []string{v}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var body struct {
			Error apiError `json:"error"`
		}
		if rec.Code != 401 || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error.Code != "unauthenticated" {
			t.Errorf("header %.40q: %d %s, want 401 unauthenticated", v, rec.Code, rec.Body)
		}
	}
}

// TestDataPathSecret: a node that cannot read the grants' key answers 503 (not 401: the
// grant may be fine); once it has the key, a new key in Redis (a Redis that lost its data)
// is read again when a grant does not verify under the old one.
func TestDataPathSecret(t *testing.T) {
	d := newDataPathEnv(t)
	s := d.running(map[string]any{"tier": 2})
	dp, err := NewDataPath(DataPathConfig{Store: d.st, Guests: d.node, NodeID: d.nodeID})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	dp.recheck = 0
	call := func(grant string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/v1/sessions/"+s.ID+"/files?path=.&list=1", nil)
		req.Header.Set(edgeauth.HeaderEdgeAuth, grant)
		rec := httptest.NewRecorder()
		dp.Handler().ServeHTTP(rec, req)
		return rec
	}
	if rec := call(d.grant(s)); rec.Code != 200 {
		t.Fatalf("with the key: %d %s", rec.Code, rec.Body)
	}
	if err := d.rdb.FlushAll(context.Background()).Err(); err != nil { // the key and the session go
		t.Fatal(err)
	}
	fresh, err := edgeauth.NewSigner(mustSecret(t, d.env), edgeauth.PurposeEdge)
	if err != nil {
		t.Fatal(err)
	}
	g := fresh.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: s.ProjectID, NodeID: d.nodeID, Expires: time.Now().Add(time.Minute).Unix()})
	if rec := call(g); rec.Code != 404 { // verified under the new key; the session is gone
		t.Fatalf("a grant under the new key: %d %s; want 404 (the session went with Redis's data)", rec.Code, rec.Body)
	}
	if rec := call(d.grant(s)); rec.Code != 401 {
		t.Fatalf("a grant under the old key: %d %s; want 401", rec.Code, rec.Body)
	}

	away := store.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1}))
	down, err := NewDataPath(DataPathConfig{Store: away, Guests: d.node, NodeID: d.nodeID})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	req := httptest.NewRequest("POST", "/v1/sessions/"+s.ID+"/exec", strings.NewReader(`{"command":"true"}`))
	req.Header.Set(edgeauth.HeaderEdgeAuth, g)
	rec := httptest.NewRecorder()
	down.Handler().ServeHTTP(rec, req)
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "edge_unavailable") || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("Redis away at first use: %d %s; want 503 edge_unavailable with Retry-After", rec.Code, rec.Body)
	}
}

// TestDataPathOutputCap: the data path keeps MaxOutputBytes of each stream of a buffered exec
// and says how much there was, as the API does.
func TestDataPathOutputCap(t *testing.T) {
	d := newDataPathEnv(t)
	s := d.running(map[string]any{"tier": 2})
	dp, err := NewDataPath(DataPathConfig{Store: d.st, Guests: d.node, NodeID: d.nodeID, MaxOutputBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	srv := httptest.NewServer(dp.Handler())
	defer srv.Close()
	capped := *d.env
	capped.url = srv.URL
	var res session.ExecResult
	capped.mustDo("POST", "/v1/sessions/"+s.ID+"/exec", "", map[string]any{"command": "head -c 100 /dev/zero | tr '\\0' a"}, 200, &res, edgeauth.HeaderEdgeAuth, d.grant(s))
	if !res.Truncated || len(res.Stdout) != 10 || res.StdoutBytes != 100 {
		t.Fatalf("capped exec: truncated %v, %d bytes kept, stdout_bytes %d; want true, 10, 100", res.Truncated, len(res.Stdout), res.StdoutBytes)
	}
}

// TestDataPathCaps: DataPathConfig's MaxConcurrentFileCalls and MaxConcurrentPTYs cap the
// data path's file calls and PTYs, as Config's do the API's. Before, DataPathConfig had
// neither, and the data path kept the defaults whatever the node was given.
func TestDataPathCaps(t *testing.T) {
	d := newDataPathEnv(t)
	s := d.running(map[string]any{"tier": 2})
	dp, err := NewDataPath(DataPathConfig{Store: d.st, Guests: d.node, NodeID: d.nodeID, MaxConcurrentFileCalls: 1, MaxConcurrentPTYs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	srv := httptest.NewServer(dp.Handler())
	defer srv.Close()
	capped := *d.env
	capped.url = srv.URL
	g := d.grant(s)
	// One call of each is in progress, as work that holds its slot would be.
	for _, ps := range []*projectSlots{dp.s.fileCalls, dp.s.ptys} {
		if err := ps.acquire(s.ProjectID, 1); err != nil {
			t.Fatal(err)
		}
		defer ps.release(s.ProjectID)
	}
	r := capped.do("GET", "/v1/sessions/"+s.ID+"/files?path=.&list=1", "", nil, edgeauth.HeaderEdgeAuth, g)
	if msg := expectError(t, r, 429, "too_many_file_calls", ""); !strings.Contains(msg, "1 file or screen call") {
		t.Errorf("a file call past a cap of 1: %s; want it to name the limit of 1", msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/sessions/" + s.ID + "/pty?command=cat"
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{edgeauth.HeaderEdgeAuth: {g}}})
	if err == nil {
		conn.CloseNow()
		t.Fatal("a PTY opened past a cap of 1")
	}
	if resp == nil || resp.StatusCode != 429 {
		t.Fatalf("a PTY past a cap of 1: %v, %v; want a 429 too_many_ptys", err, resp)
	}
}

// TestDataPathSmallAnswersStalledCallerIsCut: the node's listener (the data path, and the
// node's API behind it) bounds net/http's last writes of an answer as the gateway's does: a
// small answer of the node's API, asked for so many times on one connection that its caller,
// who takes none of them, fills the connection, ends within WriteStall of its handler's
// return, and the connection is closed. Before, it held the connection for as long as the
// caller stayed.
func TestDataPathSmallAnswersStalledCallerIsCut(t *testing.T) {
	e := newEnv(t)
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	dp, err := NewDataPath(DataPathConfig{Store: e.st, Guests: e.node, NodeID: e.node.Info.ID, Fallback: api, WriteStall: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dp.Close)
	stalledConnCloses(t, dp.Handler(), "", "/v1/node/ping", 20000)
}
