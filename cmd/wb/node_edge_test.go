//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/edgeauth"
	"wb/internal/mtls"
	"wb/internal/mtls/mtlstest"
	"wb/internal/netguard"
	"wb/internal/redistest"
	"wb/node"
	nodeclient "wb/node/client"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// denyCommand is a runtime decision point that refuses every command containing word, as a
// project's policy that cannot allow it would.
type denyCommand struct{ word string }

func (d denyCommand) Check(_ context.Context, _ node.RuntimeSession, ev session.GuestEvent) (node.Verdict, error) {
	if ev.Type == session.GuestExec && strings.Contains(strings.Join(ev.Argv, " "), d.word) {
		return node.Verdict{Deny: true, Reason: "the policy refuses " + d.word}, nil
	}
	return node.Verdict{AllowEgress: true}, nil
}

// edgeNode is a real node (runc guests) served by runNode, as `wb node` and `wb serve` serve
// theirs: its API with the node token, and the edge's data path.
type edgeNode struct {
	st     *store.Store
	nd     *node.Node
	url    string
	token  string
	signer *edgeauth.Signer
	// hc calls the listener as the edge does; nodes as the gateways do.
	hc    *http.Client
	nodes *nodeclient.Client
}

func startEdgeNode(t *testing.T) *edgeNode {
	t.Helper()
	return startEdgeNodeTLS(t, fleetTLSFlags{}, nil, nil)
}

// startEdgeNodeTLS is startEdgeNode with the node's listener served as `wb node
// --fleet-tls-*` serves it; edge is the Envoys' TLS (nil: plaintext), nodeOpts the
// gateways' client.
func startEdgeNodeTLS(t *testing.T, fleet fleetTLSFlags, edge *tls.Config, nodeOpts []nodeclient.Option) *edgeNode {
	t.Helper()
	tmp, bin := runcGuestDir(t, "wbe")
	cat, err := templates.Assemble(filepath.Join(tmp, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(&testLog{t: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rdb := redistest.Server(t)
	st := store.New(rdb)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	drv, err := oci.New(oci.Options{Runtime: "runc", StateRoot: filepath.Join(tmp, "state"), BundleRoot: filepath.Join(tmp, "bundles"),
		CgroupParent: "/wbedgetest-" + hex.EncodeToString(suffix), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // even on failure, no guest outlives the test
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ids, _ := drv.List(ctx)
		for _, id := range ids {
			_ = drv.Stop(ctx, id)
			_ = drv.Delete(ctx, id)
		}
		_ = drv.RemoveCgroupParent()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, scheme, err := nodeListener(ln, fleet, log)
	if err != nil {
		t.Fatal(err)
	}
	url := scheme + "://" + ln.Addr().String()
	tiers := session.DefaultTiers()
	for i := range tiers {
		tiers[i].ColdP95 = max(tiers[i].ColdP95, 20*time.Second) // a busy 2-core machine boots slowly
	}
	nd, err := node.New(node.Config{Store: st, Driver: drv, Templates: cat, DataDir: filepath.Join(tmp, "node"), AgentBin: filepath.Join(filepath.Dir(bin), "wb-agent"),
		Info:  store.NodeInfo{ID: "node_edge", Addr: url, Region: "local", Zone: "local-a", Tiers: []int{1, 2, 3, 4}, VCPU: 64, MemoryMiB: 1 << 20},
		Tiers: tiers, Logger: log, Runtime: denyCommand{"forbidden-word"}})
	if err != nil {
		t.Fatal(err)
	}
	const token = "wb_node_edge_test"
	platform := &platformAddrs{guards: []*netguard.Guard{nd.Egress}, st: st, rdb: rdb, nodes: []string{ln.Addr().String()}, log: log}
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	runNode(gctx, g, nd, ln, token, platform)
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("the node: %v", err)
		}
		nd.DestroyAll(context.Background())
	})
	secret, err := st.EdgeSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := edgeauth.NewSigner(secret, edgeauth.PurposeEdge)
	if err != nil {
		t.Fatal(err)
	}
	hc := http.DefaultClient
	if edge != nil {
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: edge}}
		t.Cleanup(hc.CloseIdleConnections)
	}
	return &edgeNode{st: st, nd: nd, url: url, token: token, signer: signer, hc: hc, nodes: nodeclient.New(st, token, nodeOpts...)}
}

// testLog sends log lines to t.Log until the test ends.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// placed writes a session placed on the node, as the placer does, without starting it.
func (e *edgeNode) placed(t *testing.T, project string) *session.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.st.EnsureProject(ctx, project, project); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tpl := e.nd.Templates[templates.Base]
	s, err := e.st.Create(ctx, &session.Session{ID: session.NewID("sess_", now), Tier: 2, State: session.Pending, ProjectID: project,
		Template: tpl.Name + "@" + tpl.Digest, Region: "local", CreatedAt: *session.At(now), IdleTimeoutS: 3600, MaxLifetimeS: 3600,
		Resources: session.Resources{VCPU: 1, MemoryMiB: 256, DiskGiB: 1, SizeClass: "s"}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	s, err = e.st.Transition(ctx, store.Change{Project: project, ID: s.ID, From: session.Pending, To: session.Provisioning,
		Driver: session.Placer, Zone: "local-a", NodeID: e.nd.Info.ID})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// provision places a session on the node and starts it through the node's API with the node
// token, as the placer does, and waits until it runs.
func (e *edgeNode) provision(t *testing.T, project string) *session.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := e.placed(t, project)
	if err := e.nodes.Provision(ctx, e.nd.Info, s); err != nil {
		t.Fatalf("provision through the node token's API: %v", err)
	}
	for {
		got, err := e.st.Get(ctx, project, s.ID)
		if err == nil && got.State == session.Running {
			return got
		}
		if err == nil && got.State.Terminal() || ctx.Err() != nil {
			t.Fatalf("session %s never ran: %+v %v", s.ID, got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *edgeNode) grant(s *session.Session, nodeID string, ttl time.Duration) string {
	return e.signer.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: s.ProjectID, NodeID: nodeID, Expires: time.Now().Add(ttl).Unix()})
}

// call sends a request to the node's listener with the given headers (name, value pairs).
func (e *edgeNode) call(t *testing.T, method, path string, body []byte, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// errorCode answers the code and message of an API error body.
func errorCode(b []byte) (string, string) {
	var e struct {
		Error struct {
			Code, Message string
		}
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Code, e.Error.Message
}

// TestNodeEdgeDataPath: the listener runNode serves (`wb node`'s, and `wb serve`'s embedded
// node's) answers exec, files and a PTY of a real guest to requests with an edge grant, as the
// API does; refuses them without a grant, with an expired one, with one for another session
// or another node, with nothing reaching the guest; applies the runtime policy to exec and
// PTY; and still serves the gateway's own calls with the node token.
func TestNodeEdgeDataPath(t *testing.T) {
	e := startEdgeNode(t)
	s := e.provision(t, "proj_edge")
	g := e.grant(s, e.nd.Info.ID, time.Minute)
	auth := edgeauth.HeaderEdgeAuth
	execPath := "/v1/sessions/" + s.ID + "/exec"

	// Refused, and the guest never sees the command.
	touchMarker := []byte(`{"command":"touch /tmp/edge-marker"}`)
	for _, c := range []struct {
		name string
		hdr  []string
		says string
	}{
		{"no grant", nil, auth},
		{"the node token", []string{"Authorization", "Bearer " + e.token}, auth},
		{"expired", []string{auth, e.grant(s, e.nd.Info.ID, -time.Second)}, "expired"},
		{"another session's", []string{auth, e.grant(&session.Session{ID: "sess_other", ProjectID: s.ProjectID}, e.nd.Info.ID, time.Minute)}, "sess_other"},
		{"another node's", []string{auth, e.grant(s, "node_other", time.Minute)}, "node_other"},
	} {
		status, _, body := e.call(t, "POST", execPath, touchMarker, c.hdr...)
		code, msg := errorCode(body)
		if status != 401 || code != "unauthenticated" || !strings.Contains(msg, c.says) {
			t.Errorf("%s: %d %s; want 401 unauthenticated saying %q", c.name, status, body, c.says)
		}
		if status, _, _ := e.call(t, "PUT", "/v1/sessions/"+s.ID+"/files?path=/tmp/edge-marker", []byte("x"), c.hdr...); status != 401 {
			t.Errorf("%s: PUT file %d, want 401", c.name, status)
		}
	}
	if status, _, body := e.call(t, "GET", "/v1/sessions/"+s.ID+"/files?path=/tmp/edge-marker", nil, auth, g); status != 404 {
		t.Fatalf("a refused request reached the guest: GET the marker %d %s", status, body)
	}

	// Exec, buffered and streamed.
	status, _, body := e.call(t, "POST", execPath, []byte(`{"command":"echo hi; echo err >&2; exit 3"}`), auth, g)
	var res session.ExecResult
	if err := json.Unmarshal(body, &res); status != 200 || err != nil || res.Stdout != "hi\n" || res.Stderr != "err\n" || res.ExitCode != 3 {
		t.Fatalf("exec: %d %s", status, body)
	}
	status, hdr, body := e.call(t, "POST", execPath, []byte(`{"command":"echo streamed"}`), auth, g, "Accept", "application/x-ndjson")
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if status != 200 || hdr.Get("Content-Type") != "application/x-ndjson" || len(lines) != 2 ||
		lines[0] != `{"stream":"stdout","data":"streamed\n"}` || !strings.Contains(lines[1], `"exit_code":0`) {
		t.Fatalf("streamed exec: %d %q", status, lines)
	}
	// The runtime decision point sees the data path's commands: one it cannot allow (a Deny,
	// not a kill) is refused as undecided, and the session goes on.
	status, _, body = e.call(t, "POST", execPath, []byte(`{"command":"echo forbidden-word"}`), auth, g)
	if code, msg := errorCode(body); status != 403 || code != "policy_error" || !strings.Contains(msg, "forbidden-word") {
		t.Fatalf("an exec the policy refuses: %d %s; want 403 policy_error", status, body)
	}

	// Files.
	files := "/v1/sessions/" + s.ID + "/files?path=/tmp/edge.txt"
	if status, _, body := e.call(t, "PUT", files, []byte("through the edge"), auth, g); status != 204 {
		t.Fatalf("PUT: %d %s", status, body)
	}
	if status, _, body := e.call(t, "GET", files, nil, auth, g); status != 200 || string(body) != "through the edge" {
		t.Fatalf("GET: %d %q", status, body)
	}
	if status, _, body := e.call(t, "GET", "/v1/sessions/"+s.ID+"/files?path=/tmp/&list=1", nil, auth, g); status != 200 || !strings.Contains(string(body), `"edge.txt"`) {
		t.Fatalf("list: %d %s", status, body)
	}
	if status, _, body := e.call(t, "DELETE", files, nil, auth, g); status != 204 {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	if status, _, body := e.call(t, "GET", files, nil, auth, g); status != 404 {
		t.Fatalf("GET after DELETE: %d %s", status, body)
	}

	// A PTY: bytes both ways; its command passes the runtime decision point first.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty?cols=100&rows=30"
	ptyEcho(ctx, t, ws, &websocket.DialOptions{HTTPHeader: http.Header{auth: {g}}})
	_, resp, err := websocket.Dial(ctx, ws+"&command=forbidden-word", &websocket.DialOptions{HTTPHeader: http.Header{auth: {g}}})
	if err == nil || resp == nil || resp.StatusCode != 403 {
		t.Fatalf("a PTY whose command the policy refuses: %v %v; want 403", resp, err)
	}
	if _, _, err := websocket.Dial(ctx, ws, nil); err == nil {
		t.Fatal("a PTY opened without a grant")
	}

	// The gateway's own calls, with the node token, work as before.
	nodes := nodeclient.New(e.st, e.token)
	var out []string
	r, err := nodes.Exec(ctx, s, session.ExecRequest{Command: json.RawMessage(`"echo via-node-token"`)}, nil, func(c session.ExecChunk) error {
		out = append(out, string(c.Data))
		return nil
	})
	if err != nil || r.ExitCode != 0 || !slices.Contains(out, "via-node-token\n") {
		t.Fatalf("exec through the node token's API: %+v %q %v", r, out, err)
	}

	// A session the store says runs here, but whose guest this node does not hold: the
	// node's refusal, 404, as the API answers it, not a 502.
	ghost := e.placed(t, s.ProjectID)
	ghost, err = e.st.Transition(ctx, store.Change{Project: ghost.ProjectID, ID: ghost.ID, From: session.Provisioning, To: session.Running,
		Driver: session.Node, ColdStart: new(bool)})
	if err != nil {
		t.Fatal(err)
	}
	gg := e.grant(ghost, e.nd.Info.ID, time.Minute)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sessions/" + ghost.ID + "/exec", `{"command":"true"}`},
		{"GET", "/v1/sessions/" + ghost.ID + "/files?path=/tmp", ""},
	} {
		status, _, body := e.call(t, c.method, c.path, []byte(c.body), auth, gg)
		if code, msg := errorCode(body); status != 404 || code != "not_found" || !strings.Contains(msg, "no guest") {
			t.Errorf("%s %s of a session this node does not run: %d %s; want 404 not_found", c.method, c.path, status, body)
		}
	}

	// Activity on the data path reset the idle timer.
	got, err := e.st.Get(ctx, s.ProjectID, s.ID)
	if err != nil || got.LastActivityAt == nil || !got.LastActivityAt.After(s.StartedAt.Time) {
		t.Fatalf("the data path recorded no activity: %+v %v", got, err)
	}

	// A session that ended: its grant, still valid, opens nothing.
	stopping, err := e.st.Transition(ctx, store.Change{Project: s.ProjectID, ID: s.ID, From: session.Running, To: session.Stopping,
		Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatal(err)
	}
	if err := nodes.Stop(ctx, stopping); err != nil {
		t.Fatalf("stop: %v", err)
	}
	for {
		got, err := e.st.Get(ctx, s.ProjectID, s.ID)
		if err == nil && got.State.Terminal() {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the session did not end: %+v %v", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	status, _, body = e.call(t, "POST", execPath, []byte(`{"command":"true"}`), auth, g)
	if code, msg := errorCode(body); status != 409 || code != "invalid_state" || !strings.Contains(msg, "stopped") {
		t.Fatalf("exec in an ended session: %d %s; want 409 naming the state", status, body)
	}
}

// TestServeNodeServesDataPath: in `wb serve`, the embedded node's address (its registration's
// Addr, which the edge routes to) serves the data path: a session created through the API
// runs an exec there with a grant, and refuses one without.
func TestServeNodeServesDataPath(t *testing.T) {
	p, redisAddr := startRuncServe(t, "--log-level", "warn")
	api, key := p.env["WB_URL"], p.env["WB_API_KEY"]

	do := func(method, url string, body string, hdr ...string) (int, []byte) {
		t.Helper()
		status, _, b := httpDo(t, method, url, body, hdr...)
		return status, b
	}
	status, body := do("POST", api+"/v1/sessions", `{"tier":2}`, "Authorization", "Bearer "+key)
	var s session.Session
	if err := json.Unmarshal(body, &s); status != 201 || err != nil {
		t.Fatalf("create: %d %s", status, body)
	}
	t.Cleanup(func() { do("DELETE", api+"/v1/sessions/"+s.ID, "", "Authorization", "Bearer "+key) })
	awaitCondition(t, 3*time.Minute, "the session running", func() bool {
		_, body := do("GET", api+"/v1/sessions/"+s.ID, "", "Authorization", "Bearer "+key)
		_ = json.Unmarshal(body, &s)
		if s.State.Terminal() {
			t.Fatalf("the session ended: %s\n%s", body, p.stderr())
		}
		return s.State == session.Running
	})

	st := store.New(redisClientOf(t, redisAddr))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodes, err := st.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("registered nodes %+v (%v); want the embedded node", nodes, err)
	}
	secret, err := st.EdgeSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := edgeauth.NewSigner(secret, edgeauth.PurposeEdge)
	grant := signer.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: s.ProjectID, NodeID: nodes[0].ID, Expires: time.Now().Add(time.Minute).Unix()})
	execURL := nodes[0].Addr + "/v1/sessions/" + s.ID + "/exec"
	status, body = do("POST", execURL, `{"command":"echo from-the-node"}`, edgeauth.HeaderEdgeAuth, grant)
	if status != 200 || !strings.Contains(string(body), `"stdout":"from-the-node\n"`) {
		t.Fatalf("exec on the embedded node's data path: %d %s", status, body)
	}
	if status, body = do("POST", execURL, `{"command":"true"}`); status != 401 {
		t.Fatalf("exec on the node without a grant: %d %s", status, body)
	}
	// The API's exec, through the node token's API, still works.
	status, body = do("POST", api+"/v1/sessions/"+s.ID+"/exec", `{"command":"echo via-api"}`, "Authorization", "Bearer "+key)
	if status != 200 || !strings.Contains(string(body), "via-api") {
		t.Fatalf("exec through the API: %d %s", status, body)
	}
}

func redisClientOf(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestNodeFleetTLS: with `wb node --fleet-tls-*`, the node's listener serves only TLS clients
// whose certificate the fleet's CA signed: an Envoy's runs an exec with an edge grant, and a
// gateway's (wb serve --fleet-tls-*) provisions and execs with the node token; a plaintext
// client, one without a certificate and one with another CA's certificate get nothing, even
// with a valid grant, and a gateway that does not trust the CA does not call the node.
func TestNodeFleetTLS(t *testing.T) {
	pki := mtlstest.New(t)
	gateway, err := mtls.NewDialer(mtls.Files{Cert: pki.Cert, Key: pki.Key, CA: pki.CAFile}, mtls.RoleNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := startEdgeNodeTLS(t, fleetTLSFlags{cert: pki.Cert, key: pki.Key, ca: pki.CAFile}, pki.ClientConfig(pki.Client),
		[]nodeclient.Option{nodeclient.WithDialTLS(gateway.DialTLSContext)})
	if !strings.HasPrefix(e.url, "https://") {
		t.Fatalf("the node serves %s, want https", e.url)
	}
	s := e.provision(t, "proj_fleet_tls") // the gateway's client, over mutual TLS
	g := e.grant(s, e.nd.Info.ID, time.Minute)
	auth := edgeauth.HeaderEdgeAuth
	execPath := "/v1/sessions/" + s.ID + "/exec"

	status, _, body := e.call(t, "POST", execPath, []byte(`{"command":"echo over-mtls"}`), auth, g)
	var res session.ExecResult
	if err := json.Unmarshal(body, &res); status != 200 || err != nil || res.Stdout != "over-mtls\n" {
		t.Fatalf("exec with the Envoy's certificate: %d %s", status, body)
	}
	// The rest of the data path, and the health checks, for the Envoy's certificate too.
	files := "/v1/sessions/" + s.ID + "/files?path=/tmp/envoy.txt"
	if status, _, body := e.call(t, "PUT", files, []byte("by the envoy"), auth, g); status != 204 {
		t.Fatalf("PUT a file with the Envoy's certificate: %d %s", status, body)
	}
	if status, _, body := e.call(t, "GET", files, nil, auth, g); status != 200 || string(body) != "by the envoy" {
		t.Fatalf("GET a file with the Envoy's certificate: %d %q", status, body)
	}
	if status, _, body := e.call(t, "DELETE", files, nil, auth, g); status != 204 {
		t.Fatalf("DELETE a file with the Envoy's certificate: %d %s", status, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ptyEcho(ctx, t, "wss"+strings.TrimPrefix(e.url, "https")+"/v1/sessions/"+s.ID+"/pty?cols=80&rows=24",
		&websocket.DialOptions{HTTPClient: e.hc, HTTPHeader: http.Header{auth: {g}}})
	if status, _, body := e.call(t, "GET", nodeapi.PathHealth, nil); status != 200 {
		t.Fatalf("the Envoy's health check: %d %s", status, body)
	}

	// The node API is the gateways': the Envoy's certificate, held on every Envoy host, opens
	// none of it, with the node token or without, and nothing reaches the guest.
	forbidden := []struct{ method, path, body string }{
		{"PUT", nodeapi.AgentBase(s.ID) + "/v1/files?path=/tmp/by-envoy", "x"},
		{"POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionTouch), ""},
		{"POST", nodeapi.PathProvision, "{}"},
		{"DELETE", nodeapi.SnapshotPath("snap_x"), ""},
		{"GET", "/v1/no-such-route", ""},
	}
	for _, c := range forbidden {
		for _, hdr := range [][]string{nil, {"Authorization", "Bearer " + e.token}} {
			status, _, body := e.call(t, c.method, c.path, []byte(c.body), hdr...)
			code, msg := errorCode(body)
			route := c.method + " " + strings.Split(c.path, "?")[0]
			if status != 403 || code != nodeapi.CodeForbidden || !strings.Contains(msg, mtls.RoleEnvoy) || !strings.Contains(msg, route) {
				t.Errorf("%s with the Envoy's certificate (headers %q): %d %s; want 403 %s naming the role and the route",
					route, hdr, status, body, nodeapi.CodeForbidden)
			}
		}
	}
	if status, _, body := e.call(t, "GET", "/v1/sessions/"+s.ID+"/files?path=/tmp/by-envoy", nil, auth, g); status != 404 {
		t.Fatalf("the Envoy's certificate reached the guest through the node API: GET /tmp/by-envoy %d %s", status, body)
	}
	// A certificate of the gateway role alone (pki.Member is also a node's) calls all of it.
	gw := pki.Issue(t, "gateway-only", mtls.RoleGateway)
	gwClient := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(gw.Pair)}}
	defer gwClient.CloseIdleConnections()
	for _, c := range []struct {
		method, path string
		hdr          []string
		want         int
	}{
		{"POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionTouch), []string{"Authorization", "Bearer " + e.token}, 204},
		{"POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionTouch), nil, 401},
		{"GET", nodeapi.PathHealth, nil, 200},
		{"POST", execPath, []string{auth, g}, 200},
	} {
		req, _ := http.NewRequestWithContext(ctx, c.method, e.url+c.path, strings.NewReader(`{"command":"true"}`))
		for i := 0; i+1 < len(c.hdr); i += 2 {
			req.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		resp, err := gwClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s with the gateway's certificate: %v", c.method, c.path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s with the gateway's certificate (headers %q): %d %s; want %d", c.method, c.path, c.hdr, resp.StatusCode, b, c.want)
		}
	}

	// The certificate is sent whatever CAs the server names (Go's client would send none of
	// another CA).
	tlsClient := func(certs ...tls.Certificate) *http.Client {
		cfg := pki.ClientConfig()
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if len(certs) == 0 {
				return &tls.Certificate{}, nil
			}
			return &certs[0], nil
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	for _, c := range []struct {
		name string
		hc   *http.Client
		url  string
	}{
		{"plaintext", http.DefaultClient, "http://" + strings.TrimPrefix(e.url, "https://")},
		{"TLS without a client certificate", tlsClient(), e.url},
		{"a client certificate of another CA", tlsClient(pki.Other), e.url},
	} {
		req, _ := http.NewRequest("POST", c.url+execPath, strings.NewReader(`{"command":"touch /tmp/forged"}`))
		req.Header.Set(auth, g)
		resp, err := c.hc.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 || !strings.Contains(string(b), "HTTPS") {
				t.Errorf("%s: %d %s, want refused", c.name, resp.StatusCode, b)
			}
		}
	}
	if status, _, body := e.call(t, "GET", "/v1/sessions/"+s.ID+"/files?path=/tmp/forged", nil, auth, g); status != 404 {
		t.Fatalf("a refused client reached the guest: GET /tmp/forged %d %s", status, body)
	}

	var out strings.Builder
	r, err := e.nodes.Exec(ctx, s, session.ExecRequest{Command: json.RawMessage(`"echo via-node-token"`)}, nil, func(c session.ExecChunk) error {
		out.WriteString(c.Data)
		return nil
	})
	if err != nil || r.ExitCode != 0 || out.String() != "via-node-token\n" {
		t.Fatalf("the gateway's exec over mutual TLS: %+v %q %v", r, out.String(), err)
	}
	if _, err := nodeclient.New(e.st, e.token).Exec(ctx, s, session.ExecRequest{Command: json.RawMessage(`"true"`)}, nil,
		func(session.ExecChunk) error { return nil }); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a gateway without the fleet's TLS: %v, want the node's certificate refused", err)
	}
}

// TestNodeFleetTLSFlags: wb node refuses --fleet-tls-* incomplete, or with an http:// --advertise
// that the gateways and Envoys would call in plaintext, before it starts anything.
func TestNodeFleetTLSFlags(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("wb_node_x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fleet-tls-cert", "cert.pem"}, "--fleet-tls-cert, --fleet-tls-key and --fleet-tls-ca go together"},
		{[]string{"--fleet-tls-cert", "c.pem", "--fleet-tls-key", "k.pem", "--fleet-tls-ca", "ca.pem", "--advertise", "http://10.0.0.1:7070"}, "advertise https://"},
	} {
		var out, errb strings.Builder
		args := append([]string{"node", "--redis", "redis://127.0.0.1:1", "--token-file", token, "--data-dir", t.TempDir()}, c.args...)
		if err := run(context.Background(), args, &out, &errb); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error with %q", c.args, err, c.want)
		}
	}
}
