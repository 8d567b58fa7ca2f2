//go:build linux

package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"wb/internal/edgeauth"
	"wb/internal/fleet"
	"wb/internal/redistest"
	"wb/internal/servetest"
	"wb/internal/wbbin"
	"wb/session"
	"wb/xds"
)

// runcGuestDir skips the test where runc guests cannot run here, and answers a directory for
// the guests that the test removes, and the wb binary installed in it.
func runcGuestDir(t *testing.T, prefix string) (tmp, bin string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runc needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed")
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	// Not t.TempDir(): the test's name would make the guests' Unix socket paths too long.
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil { // the guest's user must reach the agent binary
		t.Fatal(err)
	}
	if bin, err = wbbin.Install(tmp); err != nil {
		t.Fatal(err)
	}
	return tmp, bin
}

// startRuncServe starts the wb binary as `wb serve --runtime runc` with a Redis of the test's
// own and the extra args, and removes its guests (which outlive it, with such a Redis) and
// their mounts when the test ends. It answers the process and the Redis address. Its tiers'
// cold starts are servetest's (a loaded machine's).
func startRuncServe(t *testing.T, args ...string) (*wbProcess, string) {
	t.Helper()
	tmp, bin := runcGuestDir(t, "wbs")
	dataDir := filepath.Join(tmp, "d")
	t.Cleanup(func() {
		if err := fleet.Reap(context.Background(), "runc", dataDir, fleet.ServeNodeID); err != nil {
			t.Logf("wb serve's guests: %v", err)
		}
		fleet.UnmountUnder(tmp)
	})
	redisAddr := redistest.ServerAddr(t)
	p := startBinary(t, bin, append([]string{"serve", "--addr", "127.0.0.1:0", "--runtime", "runc", "--pool", "0", "--data-dir", dataDir,
		"--redis", "redis://" + redisAddr}, append(servetest.LoadedColdStarts(), args...)...)...)
	return p, redisAddr
}

// httpDo sends one request with the given headers (name, value pairs) and answers its status,
// headers and body.
func httpDo(t *testing.T, method, url, body string, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// loggedAddr waits for wb's log line msg="what" addr=host:port and answers the address.
func loggedAddr(t *testing.T, p *wbProcess, what string) string {
	t.Helper()
	re := regexp.MustCompile(`msg="` + regexp.QuoteMeta(what) + `" addr=(127\.0\.0\.1:\d+)`)
	awaitCondition(t, time.Minute, "the log line "+what, func() bool { return re.MatchString(p.stderr()) })
	return re.FindStringSubmatch(p.stderr())[1]
}

// edgeEnvoy does what an Envoy of the fleet does for a data-path request: it asks ext_authz
// (Check), and routes to the cluster named by the x-wb-cluster header ext_authz set, whose
// endpoints it learned over ADS (EDS).
type edgeEnvoy struct {
	authz authv3.AuthorizationClient
	xds   *grpc.ClientConn
	host  string // the edge's public host, as the caller sent it
}

// check sends the attributes Envoy sends for method path (path with its query) with the
// caller's headers (lower-case names), and answers the response.
func (e *edgeEnvoy) check(t *testing.T, method, path string, hdr map[string]string) *authv3.CheckResponse {
	t.Helper()
	headers := map[string]string{":method": method, ":path": path, ":authority": e.host, ":scheme": "https"}
	for k, v := range hdr {
		headers[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := e.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: method, Path: path, Host: e.host, Scheme: "https", Protocol: "HTTP/1.1", Headers: headers}}}})
	if err != nil {
		t.Fatalf("Check %s %s: %v", method, path, err)
	}
	return r
}

// allowed checks method path and answers the headers ext_authz adds (name, value pairs); a
// denial fails the test.
func (e *edgeEnvoy) allowed(t *testing.T, method, path string, hdr map[string]string) []string {
	t.Helper()
	r := e.check(t, method, path, hdr)
	ok := r.GetOkResponse()
	if r.GetStatus().GetCode() != 0 || ok == nil {
		t.Fatalf("Check %s %s denied: %d %s", method, path, r.GetDeniedResponse().GetStatus().GetCode(), r.GetDeniedResponse().GetBody())
	}
	var added []string
	for _, h := range ok.GetHeaders() {
		added = append(added, h.GetHeader().GetKey(), h.GetHeader().GetValue())
	}
	return added
}

// resource answers the first resource of typeURL (names, or every one with none) that want
// accepts, over a fresh ADS stream, waiting for a snapshot that has one (the node registers
// as wb serve starts).
func (e *edgeEnvoy) resource(t *testing.T, typeURL string, names []string, want func(*anypb.Any) bool) *anypb.Any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(e.xds).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy-e2e"}
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}
	for {
		if err := ads.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := ads.Recv()
		if err != nil {
			t.Fatalf("xDS %s %v: %v", typeURL, names, err)
		}
		for _, res := range resp.GetResources() {
			if want(res) {
				return res
			}
		}
		// ACK, and wait for the next version.
		req = &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
}

// upstream answers the base URL of the node that serves method path once ext_authz set the
// cluster header to cluster, resolved as Envoy does: wb_routes (RDS) picks the route and the
// header it names, the cluster of that name (CDS) takes its endpoints from EDS, and its
// ClusterLoadAssignment names the endpoint.
func (e *edgeEnvoy) upstream(t *testing.T, method, path, cluster string) string {
	t.Helper()
	var rc routev3.RouteConfiguration
	e.resource(t, resourcev3.RouteType, []string{xds.RouteConfigEdge}, func(a *anypb.Any) bool { return a.UnmarshalTo(&rc) == nil })
	var chosen *routev3.Route
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			re, err := regexp.Compile(r.GetMatch().GetSafeRegex().GetRegex())
			prefix := r.GetMatch().GetPrefix()
			methods := r.GetMatch().GetHeaders()
			matches := (prefix != "" && strings.HasPrefix(path, prefix)) || (r.GetMatch().GetSafeRegex() != nil && err == nil && re.MatchString(path))
			if matches && len(methods) > 0 {
				mre, err := regexp.Compile(methods[0].GetStringMatch().GetSafeRegex().GetRegex())
				matches = err == nil && mre.MatchString(method)
			}
			if matches && chosen == nil {
				chosen = r
			}
		}
	}
	if h := chosen.GetRoute().GetClusterHeader(); h != edgeauth.HeaderCluster {
		t.Fatalf("wb_routes sends %s %s by route %q to cluster header %q; want %s", method, path, chosen.GetName(), h, edgeauth.HeaderCluster)
	}
	var c clusterv3.Cluster
	e.resource(t, resourcev3.ClusterType, nil, func(a *anypb.Any) bool { return a.UnmarshalTo(&c) == nil && c.GetName() == cluster })
	if c.GetType() != clusterv3.Cluster_EDS {
		t.Fatalf("cluster %s is %v; want EDS", cluster, c.GetType())
	}
	var cla endpointv3.ClusterLoadAssignment
	e.resource(t, resourcev3.EndpointType, []string{cluster}, func(a *anypb.Any) bool {
		return a.UnmarshalTo(&cla) == nil && cla.GetClusterName() == cluster && len(cla.GetEndpoints()) > 0 && len(cla.GetEndpoints()[0].GetLbEndpoints()) > 0
	})
	sa := cla.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	return "http://" + net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
}

// headerValue answers the value of name in pairs.
func headerValue(pairs []string, name string) string {
	for i := 0; i+1 < len(pairs); i += 2 {
		if strings.EqualFold(pairs[i], name) {
			return pairs[i+1]
		}
	}
	return ""
}

// TestEdgeEndToEnd chains the edge's parts the way an Envoy of the fleet would, against one
// `wb serve --runtime runc --authz-addr --xds-addr`: ext_authz Check for a data-path request
// (by API key, or by the connect URL's token), the x-wb-cluster it answers resolved through
// the xDS server's RDS, CDS and EDS, and the request sent there with ext_authz's headers: exec (buffered
// and streamed), files and a PTY reach the guest. Without ext_authz's headers, or with another
// session's grant, the node refuses and nothing runs; a bad key and a paused session are
// denied by Check with the API's status and body.
func TestEdgeEndToEnd(t *testing.T) {
	p, _ := startRuncServe(t, "--authz-addr", "127.0.0.1:0", "--xds-addr", "127.0.0.1:0", "--log-level", "info")
	api, key := p.env["WB_URL"], p.env["WB_API_KEY"]
	byKey := "Bearer " + key

	create := func() session.Session {
		t.Helper()
		status, _, body := httpDo(t, "POST", api+"/v1/sessions", `{"tier":2}`, "Authorization", byKey)
		var s session.Session
		if err := json.Unmarshal(body, &s); status != 201 || err != nil {
			t.Fatalf("create: %d %s", status, body)
		}
		t.Cleanup(func() { httpDo(t, "DELETE", api+"/v1/sessions/"+s.ID, "", "Authorization", byKey) })
		return s
	}
	awaitRunning := func(s *session.Session) {
		t.Helper()
		awaitCondition(t, 3*time.Minute, s.ID+" running", func() bool {
			_, _, body := httpDo(t, "GET", api+"/v1/sessions/"+s.ID, "", "Authorization", byKey)
			_ = json.Unmarshal(body, s)
			if s.State.Terminal() {
				t.Fatalf("the session ended: %s\n%s", body, p.stderr())
			}
			return s.State == session.Running
		})
	}
	s, other := create(), create()
	awaitRunning(&s)
	awaitRunning(&other)

	authzConn, err := grpc.NewClient(loggedAddr(t, p, "ext_authz served"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer authzConn.Close()
	xdsConn, err := grpc.NewClient(loggedAddr(t, p, "xds served"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer xdsConn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	execURL, err := url.Parse(s.Connect.ExecURL)
	if err != nil || s.Connect.ExecURL == "" {
		t.Fatalf("connect.exec_url %q: %v", s.Connect.ExecURL, err)
	}
	envoy := &edgeEnvoy{authz: authv3.NewAuthorizationClient(authzConn), xds: xdsConn, host: execURL.Host}
	keyHeader := map[string]string{"authorization": byKey}
	execPath := "/v1/sessions/" + s.ID + "/exec"

	// By API key: Check, resolve the cluster through EDS, send there with the added headers
	// (and the caller's own, as Envoy forwards them).
	added := envoy.allowed(t, "POST", execPath, keyHeader)
	cluster := headerValue(added, edgeauth.HeaderCluster)
	if cluster == "" || headerValue(added, edgeauth.HeaderEdgeAuth) == "" {
		t.Fatalf("Check added %q; want %s and %s", added, edgeauth.HeaderCluster, edgeauth.HeaderEdgeAuth)
	}
	node := envoy.upstream(t, "POST", execPath, cluster)
	withAdded := func(pairs []string, more ...string) []string { return append(append([]string(nil), pairs...), more...) }
	status, _, body := httpDo(t, "POST", node+execPath, `{"command":"echo hi-$((6*7)); echo err >&2; exit 3"}`, withAdded(added, "Authorization", byKey)...)
	var res session.ExecResult
	if err := json.Unmarshal(body, &res); status != 200 || err != nil || res.Stdout != "hi-42\n" || res.Stderr != "err\n" || res.ExitCode != 3 {
		t.Fatalf("exec through the edge: %d %s", status, body)
	}
	status, hdr, body := httpDo(t, "POST", node+execPath, `{"command":"echo streamed"}`, withAdded(added, "Authorization", byKey, "Accept", "application/x-ndjson")...)
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if status != 200 || hdr.Get("Content-Type") != "application/x-ndjson" || len(lines) != 2 ||
		lines[0] != `{"stream":"stdout","data":"streamed\n"}` || !strings.Contains(lines[1], `"exit_code":0`) {
		t.Fatalf("streamed exec through the edge: %d %q", status, lines)
	}

	// By the connect URL's token, no Authorization: the path, token included, goes to the node
	// as it came.
	byToken := envoy.allowed(t, "POST", execURL.RequestURI(), nil)
	if c := headerValue(byToken, edgeauth.HeaderCluster); c != cluster {
		t.Fatalf("by token, cluster %q; by key %q", c, cluster)
	}
	status, _, body = httpDo(t, "POST", node+execURL.RequestURI(), `{"command":"echo by-token"}`, byToken...)
	if status != 200 || !strings.Contains(string(body), `"stdout":"by-token\n"`) {
		t.Fatalf("exec by the connect token through the edge: %d %s", status, body)
	}

	// Files by API key, through the same chain.
	files := "/v1/sessions/" + s.ID + "/files?path=/tmp/edge.txt"
	if status, _, body := httpDo(t, "PUT", node+files, "through the edge", withAdded(envoy.allowed(t, "PUT", files, keyHeader), "Authorization", byKey)...); status != 204 {
		t.Fatalf("PUT a file through the edge: %d %s", status, body)
	}
	if status, _, body := httpDo(t, "GET", node+files, "", withAdded(envoy.allowed(t, "GET", files, keyHeader), "Authorization", byKey)...); status != 200 || string(body) != "through the edge" {
		t.Fatalf("GET a file through the edge: %d %q", status, body)
	}

	// A PTY by the connect pty_url's token, through the same chain.
	ptyURL, err := url.Parse(s.Connect.PTYURL)
	if err != nil || s.Connect.PTYURL == "" {
		t.Fatalf("connect.pty_url %q: %v", s.Connect.PTYURL, err)
	}
	ptyAdded := envoy.allowed(t, "GET", ptyURL.RequestURI(), map[string]string{"upgrade": "websocket", "connection": "upgrade"})
	if ptyNode := envoy.upstream(t, "GET", ptyURL.Path, headerValue(ptyAdded, edgeauth.HeaderCluster)); ptyNode != node {
		t.Fatalf("the PTY goes to %s, exec to %s", ptyNode, node)
	}
	ws := http.Header{}
	for i := 0; i+1 < len(ptyAdded); i += 2 {
		ws.Set(ptyAdded[i], ptyAdded[i+1])
	}
	ptyEcho(ctx, t, "ws"+strings.TrimPrefix(node, "http")+ptyURL.RequestURI(), &websocket.DialOptions{HTTPHeader: ws})

	// Refused at the node: without ext_authz's headers (a caller that skips the edge), and with
	// the grant ext_authz signed for another session. Nothing runs.
	otherAdded := envoy.allowed(t, "POST", "/v1/sessions/"+other.ID+"/exec", keyHeader)
	touch := `{"command":"touch /tmp/edge-marker"}`
	for _, c := range []struct {
		name string
		hdr  []string
		says string
	}{
		{"without ext_authz's headers", []string{"Authorization", byKey}, edgeauth.HeaderEdgeAuth},
		{"with another session's grant", withAdded(otherAdded, "Authorization", byKey), other.ID},
	} {
		status, _, body := httpDo(t, "POST", node+execPath, touch, c.hdr...)
		if code, msg := errorCode(body); status != 401 || code != "unauthenticated" || !strings.Contains(msg, c.says) {
			t.Errorf("%s: %d %s; want 401 unauthenticated naming %q", c.name, status, body, c.says)
		}
	}
	added = envoy.allowed(t, "POST", execPath, keyHeader)
	status, _, body = httpDo(t, "POST", node+execPath, `{"command":"test -e /tmp/edge-marker"}`, added...)
	if err := json.Unmarshal(body, &res); status != 200 || err != nil || res.ExitCode != 1 {
		t.Fatalf("a refused request ran in the guest (test -e answers %d %s)", status, body)
	}

	// Denied by Check: a bad key, and a paused session (with the API's own status and body).
	r := envoy.check(t, "POST", execPath, map[string]string{"authorization": "Bearer wb_live_nope"})
	if d := r.GetDeniedResponse(); d.GetStatus().GetCode() != 401 || r.GetStatus().GetCode() == 0 {
		t.Errorf("bad key: %d %s; want 401", d.GetStatus().GetCode(), d.GetBody())
	}
	if status, _, body := httpDo(t, "POST", api+"/v1/sessions/"+s.ID+":pause", "", "Authorization", byKey); status != 200 {
		t.Fatalf("pause: %d %s", status, body)
	}
	status, _, apiBody := httpDo(t, "POST", api+execPath, `{"command":"true"}`, "Authorization", byKey)
	if status != 409 {
		t.Fatalf("the API's exec of a paused session: %d %s; want 409", status, apiBody)
	}
	awaitCondition(t, time.Minute, "Check to deny the paused session", func() bool {
		return envoy.check(t, "POST", execPath, keyHeader).GetDeniedResponse() != nil
	})
	d := envoy.check(t, "POST", execPath, keyHeader).GetDeniedResponse()
	if d.GetStatus().GetCode() != 409 || d.GetBody() != string(apiBody) {
		t.Errorf("Check of a paused session: %d %q; want the API's 409 %q", d.GetStatus().GetCode(), d.GetBody(), apiBody)
	}
}

// ptyEcho opens the PTY at url with opts (its headers, its TLS client), runs an echo in it and waits for its output.
func ptyEcho(ctx context.Context, t *testing.T, url string, opts *websocket.DialOptions) {
	t.Helper()
	conn, _, err := websocket.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("PTY %s: %v", url, err)
	}
	defer conn.Close(websocket.StatusNormalClosure, "")
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("echo pty-$((6*7))\n")); err != nil {
		t.Fatal(err)
	}
	var seen string
	for !strings.Contains(seen, "pty-42") {
		_, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("PTY read after %q: %v", seen, err)
		}
		seen += string(b)
	}
}
