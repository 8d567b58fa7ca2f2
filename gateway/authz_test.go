package gateway

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"wb/internal/edgeauth"
	"wb/internal/testwait"
	"wb/session"
	"wb/store"
)

// authzClient serves the env's ext_authz over a real gRPC connection (bufconn) and answers
// a client of it.
func authzClient(t *testing.T, e *env) authv3.AuthorizationClient {
	t.Helper()
	a, err := e.gw.Authz(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	a.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///authz",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); g.Stop() })
	return authv3.NewAuthorizationClient(conn)
}

// check asks ext_authz about method and target with the given headers (lower-case names).
func check(t *testing.T, c authv3.AuthorizationClient, method, target string, headers map[string]string) *authv3.CheckResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: method, Path: target, Headers: headers}}}})
	if err != nil {
		t.Fatalf("Check %s %s: %v", method, target, err)
	}
	return resp
}

func bearer(key string) map[string]string { return map[string]string{"authorization": "Bearer " + key} }

// allowed answers the headers ext_authz sets on an allowed request, failing on a denial or a
// header set without OVERWRITE_IF_EXISTS_OR_ADD.
func allowed(t *testing.T, r *authv3.CheckResponse) map[string]string {
	t.Helper()
	ok := r.GetOkResponse()
	if r.GetStatus().GetCode() != int32(codes.OK) || ok == nil {
		t.Fatalf("denied: %d %s", r.GetDeniedResponse().GetStatus().GetCode(), r.GetDeniedResponse().GetBody())
	}
	out := map[string]string{}
	for _, h := range ok.GetHeaders() {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			t.Errorf("header %s is set with %s; a caller's value would survive", h.GetHeader().GetKey(), h.GetAppendAction())
		}
		out[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	return out
}

// denied checks a denial's HTTP status and JSON error body, and answers the body.
func denied(t *testing.T, r *authv3.CheckResponse, status int, code codes.Code) string {
	t.Helper()
	d := r.GetDeniedResponse()
	if d == nil || r.GetStatus().GetCode() != int32(code) || int(d.GetStatus().GetCode()) != status {
		t.Fatalf("answer %v, want a %d denial with gRPC %s", r, status, code)
	}
	ctype := ""
	for _, h := range d.GetHeaders() {
		if h.GetHeader().GetKey() == "content-type" {
			ctype = h.GetHeader().GetValue()
		}
	}
	if ctype != "application/json" {
		t.Errorf("denial content-type %q, want application/json", ctype)
	}
	return d.GetBody()
}

// sameAsAPI checks that a denial's body is, byte for byte, the HTTP API's answer to the same
// request.
func sameAsAPI(t *testing.T, body string, api response) {
	t.Helper()
	if body != string(api.body) {
		t.Errorf("ext_authz answered\n%s\nthe API answers (%d)\n%s", body, api.status, api.body)
	}
}

func edgeSigner(t *testing.T, st *store.Store, purpose string) *edgeauth.Signer {
	t.Helper()
	secret, err := st.EdgeSecret(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sg, err := edgeauth.NewSigner(secret, purpose)
	if err != nil {
		t.Fatal(err)
	}
	return sg
}

// tokenOf answers the connect token of a connect URL.
func tokenOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	tok := p.Query().Get("token")
	if tok == "" {
		t.Fatalf("connect URL %s has no token", u)
	}
	return tok
}

// TestAuthzCheck: ext_authz over gRPC lets the caller's running session through to its node
// with the node's cluster and a signed edge grant (overwriting what the caller sent), and
// refuses another project's session, an unknown one, a bad key, an expired or misdirected
// token, with the HTTP API's status and body.
func TestAuthzCheck(t *testing.T) {
	e := newEnv(t)
	c := authzClient(t, e)
	s := e.running(map[string]any{"tier": 2})
	other := e.running(map[string]any{"tier": 2})
	stored, err := e.st.Get(context.Background(), e.projA, s.ID)
	if err != nil || stored.NodeID == "" {
		t.Fatalf("stored session %+v %v: want a node", stored, err)
	}
	edge := edgeSigner(t, e.st, edgeauth.PurposeEdge)
	base := "/v1/sessions/" + s.ID

	// The caller's running session, by key: the node's cluster and an edge grant, on every
	// data-path route; a caller's own x-wb-cluster and x-wb-edge-auth are replaced.
	for _, rt := range [][2]string{{"POST", base + "/exec"}, {"GET", base + "/pty?cols=80"}, {"GET", base + "/files?path=a"},
		{"PUT", base + "/files?path=a"}, {"DELETE", base + "/files?path=a"}} {
		hdr := bearer(e.key)
		hdr[edgeauth.HeaderCluster] = "wb_node_evil"
		hdr[edgeauth.HeaderEdgeAuth] = "forged"
		before := time.Now()
		got := allowed(t, check(t, c, rt[0], rt[1], hdr))
		if got[edgeauth.HeaderCluster] != "wb_node_"+stored.NodeID {
			t.Errorf("%s %s: %s = %q, want wb_node_%s", rt[0], rt[1], edgeauth.HeaderCluster, got[edgeauth.HeaderCluster], stored.NodeID)
		}
		g, err := edge.Verify(got[edgeauth.HeaderEdgeAuth], time.Now())
		if err != nil {
			t.Fatalf("%s %s: the edge grant does not verify: %v", rt[0], rt[1], err)
		}
		if g.SessionID != s.ID || g.ProjectID != e.projA || g.NodeID != stored.NodeID ||
			g.ExpiresAt().Before(before.Add(EdgeGrantTTL-2*time.Second)) || g.ExpiresAt().After(time.Now().Add(EdgeGrantTTL+time.Second)) {
			t.Errorf("%s %s: grant %+v, want session %s, project %s, node %s, for %s", rt[0], rt[1], g, s.ID, e.projA, stored.NodeID, EdgeGrantTTL)
		}
	}

	// By the connect token of the session's own connect URL, with no key.
	var fresh session.Session
	e.mustDo("GET", base, e.key, nil, 200, &fresh)
	tok := tokenOf(t, fresh.Connect.ExecURL)
	if tokenOf(t, fresh.Connect.PTYURL) != tok {
		t.Errorf("exec and PTY URLs carry different tokens")
	}
	got := allowed(t, check(t, c, "POST", base+"/exec?token="+tok, nil))
	if got[edgeauth.HeaderCluster] != "wb_node_"+stored.NodeID {
		t.Errorf("by token: cluster %q", got[edgeauth.HeaderCluster])
	}

	// Another project's session answers as an unknown one does: 404, the API's body.
	_, keyB := e.newProject("B", nil)
	body := denied(t, check(t, c, "GET", base+"/files?path=a", bearer(keyB)), 404, codes.PermissionDenied)
	sameAsAPI(t, body, e.do("GET", base+"/files?path=a", keyB, nil))
	body = denied(t, check(t, c, "POST", "/v1/sessions/sess_nope/exec", bearer(e.key)), 404, codes.PermissionDenied)
	if !strings.Contains(body, `no session \"sess_nope\" in this project`) {
		t.Errorf("unknown session: %s", body)
	}

	// A bad key, no credential at all: 401 as the API answers.
	body = denied(t, check(t, c, "GET", base+"/files?path=a", bearer("wb_live_nope")), 401, codes.Unauthenticated)
	sameAsAPI(t, body, e.do("GET", base+"/files?path=a", "wb_live_nope", nil))
	body = denied(t, check(t, c, "GET", base+"/files?path=a", nil), 401, codes.Unauthenticated)
	sameAsAPI(t, body, e.do("GET", base+"/files?path=a", "", nil))

	// An expired token: 401 naming its expiry. A token of another session opens nothing here.
	connect := edgeSigner(t, e.st, edgeauth.PurposeConnect)
	expired := connect.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: e.projA, Expires: time.Now().Add(-time.Minute).Unix()})
	body = denied(t, check(t, c, "POST", base+"/exec?token="+expired, nil), 401, codes.Unauthenticated)
	if !strings.Contains(body, "expired at") {
		t.Errorf("expired token: %s", body)
	}
	sameAsAPI(t, body, e.do("POST", base+"/exec?token="+expired, "", map[string]any{"command": "true"}))
	var otherFresh session.Session
	e.mustDo("GET", "/v1/sessions/"+other.ID, e.key, nil, 200, &otherFresh)
	misdirected := tokenOf(t, otherFresh.Connect.ExecURL)
	body = denied(t, check(t, c, "POST", base+"/exec?token="+misdirected, nil), 401, codes.Unauthenticated)
	sameAsAPI(t, body, e.do("POST", base+"/exec?token="+misdirected, "", map[string]any{"command": "true"}))
	// An edge grant is no connect token.
	edgeGrant := edge.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: e.projA, Expires: time.Now().Add(time.Minute).Unix()})
	denied(t, check(t, c, "POST", base+"/exec?token="+edgeGrant, nil), 401, codes.Unauthenticated)

	// Anything off the data path is allowed untouched, minus the data path's own headers.
	for _, rt := range [][2]string{{"GET", "/v1/sessions"}, {"GET", base}, {"GET", base + "/exec"}, {"POST", base + ":pause"}} {
		r := check(t, c, rt[0], rt[1], map[string]string{edgeauth.HeaderCluster: "wb_node_evil"})
		if got := allowed(t, r); len(got) != 0 {
			t.Errorf("%s %s: headers %v, want none", rt[0], rt[1], got)
		}
		if rm := r.GetOkResponse().GetHeadersToRemove(); len(rm) != 2 || rm[0] != edgeauth.HeaderCluster {
			t.Errorf("%s %s: removes %v, want the data path's headers", rt[0], rt[1], rm)
		}
	}
}

// frozenClock is a Config.Now that follows time.Now until stop, then stays: with it, a
// cached lookup never expires, so only an invalidation can change ext_authz's answer.
type frozenClock struct{ at atomic.Pointer[time.Time] }

func (c *frozenClock) now() time.Time {
	if t := c.at.Load(); t != nil {
		return *t
	}
	return time.Now()
}

func (c *frozenClock) stop() { now := time.Now(); c.at.Store(&now) }

// TestAuthzRefusesPausedAtOnce: a session this gateway paused is refused by the very next
// Check (409, the API's body), though the running one was cached a moment before, and is let
// through again once resumed. The gateway's clock is stopped and the tail of session events
// never started: the gateway's own transitions drop what it cached.
func TestAuthzRefusesPausedAtOnce(t *testing.T) {
	var clock frozenClock
	e := newEnv(t, func(c *Config) { c.Now = clock.now })
	e.gw.access.watch.Do(func() {}) // no tail of session events
	c := authzClient(t, e)
	s := e.running(map[string]any{"tier": 2})
	clock.stop()
	exec := "/v1/sessions/" + s.ID + "/exec"
	allowed(t, check(t, c, "POST", exec, bearer(e.key)))
	e.mustDo("POST", "/v1/sessions/"+s.ID+":pause", e.key, nil, 200, nil)
	body := denied(t, check(t, c, "POST", exec, bearer(e.key)), 409, codes.PermissionDenied)
	sameAsAPI(t, body, e.do("POST", exec, e.key, map[string]any{"command": "true"}))
	body = denied(t, check(t, c, "GET", "/v1/sessions/"+s.ID+"/pty", bearer(e.key)), 409, codes.PermissionDenied)
	if !strings.Contains(body, "session is paused") {
		t.Errorf("paused PTY: %s", body)
	}
	e.mustDo("POST", "/v1/sessions/"+s.ID+":resume", e.key, nil, 200, nil)
	allowed(t, check(t, c, "POST", exec, bearer(e.key)))
}

// TestAuthzHearsOtherWriters: a transition made by another process (here the node's idle
// timer, written straight to the store) reaches ext_authz's cache through the session events,
// not through its expiry: the gateway's clock is stopped, so a cached lookup never expires.
func TestAuthzHearsOtherWriters(t *testing.T) {
	var clock frozenClock
	e := newEnv(t, func(c *Config) { c.Now = clock.now })
	c := authzClient(t, e)
	s := e.running(map[string]any{"tier": 2})
	clock.stop()
	exec := "/v1/sessions/" + s.ID + "/exec"
	allowed(t, check(t, c, "POST", exec, bearer(e.key)))
	if _, err := e.st.Transition(context.Background(), store.Change{Project: e.projA, ID: s.ID, From: session.Running,
		To: session.Stopping, Driver: session.Timer, Reason: session.IdleTimeout}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, "ext_authz refuses the stopping session", func() bool {
		r := check(t, c, "POST", exec, bearer(e.key))
		return r.GetDeniedResponse().GetStatus().GetCode() == http.StatusConflict
	})
}

// TestSessionLookups: a cached lookup is trusted for lookupTTL and no longer; a drop of its
// project, or a flush, makes the next get read again; a read that began before a drop is
// answered but not kept.
func TestSessionLookups(t *testing.T) {
	var c sessionLookups
	reads := 0
	state := session.Running
	load := func() (sessionFacts, error) {
		reads++
		return sessionFacts{found: true, state: state, nodeID: "n"}, nil
	}
	t0 := time.Unix(1_800_000_000, 0)
	get := func(at time.Time) session.State {
		f, err := c.get("proj_a", "sess_a", at, load)
		if err != nil {
			t.Fatal(err)
		}
		return f.state
	}
	get(t0)
	get(t0.Add(lookupTTL - time.Millisecond))
	if reads != 1 {
		t.Fatalf("%d reads within the TTL, want 1", reads)
	}
	state = session.Paused
	if got := get(t0.Add(lookupTTL)); got != session.Paused || reads != 2 {
		t.Fatalf("after the TTL: %s after %d reads, want paused after 2", got, reads)
	}
	state = session.Running
	c.forget("proj_b")
	if get(t0.Add(lookupTTL)) != session.Paused {
		t.Fatal("another project's drop dropped this one")
	}
	c.forget("proj_a")
	if got := get(t0.Add(lookupTTL)); got != session.Running || reads != 3 {
		t.Fatalf("after a drop: %s after %d reads", got, reads)
	}
	c.flush()
	get(t0.Add(lookupTTL))
	if reads != 4 {
		t.Fatalf("after a flush: %d reads, want 4", reads)
	}
	// A read overtaken by a drop is not kept.
	stale := func() (sessionFacts, error) {
		c.forget("proj_a")
		reads++
		return sessionFacts{found: true, state: session.Paused}, nil
	}
	c.forget("proj_a")
	if f, _ := c.get("proj_a", "sess_a", t0, stale); f.state != session.Paused {
		t.Fatalf("the overtaken read answered %s", f.state)
	}
	if got := get(t0); got != session.Running {
		t.Fatalf("an overtaken read was kept: %s", got)
	}
}

func TestNodeCluster(t *testing.T) {
	for in, want := range map[string]string{"node_local": "wb_node_node_local", "n-1.a": "wb_node_n-1.a", "a b/c:d": "wb_node_a_b_c_d", "é": "wb_node__"} {
		if got := edgeauth.NodeCluster(in); got != want {
			t.Errorf("NodeCluster(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseDataRoute(t *testing.T) {
	for _, tc := range []struct {
		method, target string
		id             string
		op             dataOp
	}{
		{"POST", "/v1/sessions/sess_a/exec", "sess_a", opExec},
		{"POST", "/v1/sessions/sess_a/exec?token=x", "sess_a", opExec},
		{"GET", "/v1/sessions/sess_a/pty?cols=1", "sess_a", opPTY},
		{"GET", "/v1/sessions/sess_a/files?path=/x/y", "sess_a", opFiles},
		{"PUT", "/v1/sessions/sess_a/files", "sess_a", opFiles},
		{"DELETE", "/v1/sessions/sess_a/files", "sess_a", opFiles},
		{"GET", "/v1/sessions/sess_a/exec", "", 0},
		{"POST", "/v1/sessions/sess_a/pty", "", 0},
		{"POST", "/v1/sessions/sess_a", "", 0},
		{"GET", "/v1/sessions", "", 0},
		{"POST", "/v1/sessions//exec", "", 0},
		{"POST", "/v1/sessions/a/b/exec", "", 0},
		{"POST", "/v1/sessions/sess_a/exec/", "", 0},
		{"POST", "/v2/sessions/sess_a/exec", "", 0},
		{"POST", "/v1/sessions/" + strings.Repeat("a", maxSessionIDLen+1) + "/exec", "", 0},
	} {
		r, ok := parseDataRoute(tc.method, tc.target)
		if ok != (tc.op != 0) || r.sessionID != tc.id || r.op != tc.op {
			t.Errorf("parseDataRoute(%s %s) = %+v %v, want %q %d", tc.method, tc.target, r, ok, tc.id, tc.op)
		}
	}
}
