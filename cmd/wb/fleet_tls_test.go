//go:build linux

package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/internal/mtls/mtlstest"
	"wb/internal/syncbuf"
	"wb/internal/testwait"
	"wb/node/nodeapi"
)

// serveOK serves "ok" over HTTP on ln until the test ends.
func serveOK(t *testing.T, ln net.Listener) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
}

// getWith fetches https://addr/ presenting cert (sent whatever CAs the server names), trusting
// p's CA.
func getWith(p mtlstest.PKI, addr string, cert tls.Certificate) (string, error) {
	cfg := p.ClientConfig()
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	tr := &http.Transport{TLSClientConfig: cfg}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// roleCase is a client of the fleet's CA of some roles, and whether a listener serves it.
type roleCase struct {
	name  string
	roles []string
	ok    bool
}

// checkRoles serves each case's client on addr or refuses it; a refusal is logged in logs
// naming the roles the listener takes (want) and the client's SANs.
func checkRoles(t *testing.T, p mtlstest.PKI, addr string, logs *syncbuf.Buffer, want string, cases []roleCase) {
	t.Helper()
	for i, c := range cases {
		leaf := p.Issue(t, "client"+string(rune('a'+i)), c.roles...)
		body, err := getWith(p, addr, leaf.Pair)
		switch {
		case c.ok && (err != nil || body != "ok"):
			t.Errorf("a client of %s: %q, %v; want served", c.name, body, err)
		case !c.ok && err == nil:
			t.Errorf("a client of %s: %q, want refused", c.name, body)
		case !c.ok:
			found := "[" + strings.Join(c.roles, " ") + "]"
			if len(c.roles) == 0 {
				found = "no URI SAN"
			}
			if l := logs.String(); !strings.Contains(l, want) || !strings.Contains(l, found) {
				t.Errorf("a client of %s refused, but the log does not name the roles taken (%s) and the ones found (%s):\n%s", c.name, want, found, l)
			}
		}
	}
}

// TestNodeListenerRoles: a node's listener serves the Envoys (the edge's data path) and the
// gateways (the node API), and refuses any other certificate of the fleet's CA: another
// node's (a compromised node host has one), or one of no role, with a log naming the roles it
// takes and the certificate's SANs.
func TestNodeListenerRoles(t *testing.T) {
	p := mtlstest.New(t)
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, scheme, err := nodeListener(ln, fleetTLSFlags{cert: p.Cert, key: p.Key, ca: p.CAFile}, log)
	if err != nil || scheme != "https" {
		t.Fatalf("nodeListener: %s, %v", scheme, err)
	}
	serveOK(t, ln)
	checkRoles(t, p, ln.Addr().String(), &logs, "spiffe://wb/envoy or spiffe://wb/gateway", []roleCase{
		{"the Envoy role", []string{mtlstest.RoleEnvoy}, true},
		{"the gateway role", []string{mtlstest.RoleGateway}, true},
		{"the node role", []string{mtlstest.RoleNode}, false},
		{"no role", nil, false},
		{"another scheme", []string{"spiffe://other/envoy"}, false},
	})
}

// serveNodeListener serves h on a node's --fleet-tls-* listener (nodeListener) with p's
// certificates, on loopback, and answers its address.
func serveNodeListener(t *testing.T, p mtlstest.PKI, h http.Handler) string {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, _, err := nodeListener(raw, fleetTLSFlags{cert: p.Cert, key: p.Key, ca: p.CAFile}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// TestNodeAPIGatewaysOnly: behind a node's listener, gatewaysOnly lets a gateway's certificate
// call every route of the node API, an Envoy's only /healthz (the data path is served before
// it: TestNodeFleetTLS), with a 403 in the node's error shape naming the role and the route
// elsewhere; without TLS every caller passes, as before.
func TestNodeAPIGatewaysOnly(t *testing.T) {
	p := mtlstest.New(t)
	var logs syncbuf.Buffer
	api := gatewaysOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "api "+r.Method+" "+r.URL.Path)
	}), slog.New(slog.NewTextHandler(&logs, nil)))
	serve := func(ln net.Listener) string {
		srv := &http.Server{Handler: api}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })
		return ln.Addr().String()
	}
	addr := serveNodeListener(t, p, api)
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	plainAddr := serve(plain)
	call := func(hc *http.Client, url, method string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("Authorization", "Bearer wb_node_token")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	client := func(cert tls.Certificate) *http.Client {
		tr := &http.Transport{TLSClientConfig: p.ClientConfig(cert)}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	envoy := client(p.Issue(t, "envoy", mtlstest.RoleEnvoy).Pair)
	gateway := client(p.Issue(t, "gateway", mtlstest.RoleGateway).Pair)
	both := client(p.Issue(t, "both", mtlstest.RoleEnvoy, mtlstest.RoleGateway).Pair)
	for _, route := range []struct{ method, path string }{
		{"POST", "/v1/provision"},
		{"POST", "/v1/sessions/sess_x:stop"},
		{"PUT", "/v1/sessions/sess_x/agent/v1/files"},
		{"DELETE", "/v1/snapshots/snap_x"},
		{"GET", "/healthz"},
	} {
		want := "api " + route.method + " " + route.path
		for name, hc := range map[string]*http.Client{"a gateway's certificate": gateway, "a certificate of both roles": both} {
			if status, body := call(hc, "https://"+addr+route.path, route.method); status != 200 || body != want {
				t.Errorf("%s %s with %s: %d %s; want the node API's %q", route.method, route.path, name, status, body, want)
			}
		}
		if status, body := call(http.DefaultClient, "http://"+plainAddr+route.path, route.method); status != 200 || body != want {
			t.Errorf("%s %s in plaintext: %d %s; want the node API's %q", route.method, route.path, status, body, want)
		}
		status, body := call(envoy, "https://"+addr+route.path, route.method)
		if route.path == "/healthz" {
			if status != 200 || body != want {
				t.Errorf("the Envoy's health check: %d %s; want the node API's %q", status, body, want)
			}
			continue
		}
		e := nodeapi.ParseError(status, []byte(body))
		wantMsg := "node: a client certificate of the role spiffe://wb/envoy calls only the edge's exec, PTY and files and /healthz here, not " +
			route.method + " " + route.path + ": the node API is the gateways' (spiffe://wb/gateway)"
		if status != 403 || e.Code != nodeapi.CodeForbidden || e.Message != wantMsg {
			t.Errorf("%s %s with the Envoy's certificate: %d %s; want 403 %s %q", route.method, route.path, status, body, nodeapi.CodeForbidden, wantMsg)
		}
		if l := logs.String(); !strings.Contains(l, "refused a client certificate that is not of the gateway role") || !strings.Contains(l, "path="+route.path) {
			t.Errorf("%s %s with the Envoy's certificate: the refusal is not logged with the route:\n%s", route.method, route.path, l)
		}
	}
}

// TestEdgeListenerRoles: a gateway's --edge-addr serves the Envoys only: a node's certificate
// (a compromised node host could otherwise call the API as the edge) or a gateway's is
// refused, with a log naming the role it takes and the certificate's SANs.
func TestEdgeListenerRoles(t *testing.T) {
	p := mtlstest.New(t)
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ln, err := listenEdge("127.0.0.1:0", fleetTLSFlags{cert: p.Cert, key: p.Key, ca: p.CAFile}, log)
	if err != nil {
		t.Fatal(err)
	}
	serveOK(t, ln)
	checkRoles(t, p, ln.Addr().String(), &logs, "spiffe://wb/envoy", []roleCase{
		{"the Envoy role", []string{mtlstest.RoleEnvoy}, true},
		{"the node role", []string{mtlstest.RoleNode}, false},
		{"the gateway role", []string{mtlstest.RoleGateway}, false},
		{"no role", nil, false},
	})
}

// TestNodeDialerRole: the gateway's client of the nodes talks only to a server whose
// certificate has the node role, besides naming the node's IP: a gateway's or an Envoy's
// certificate of the fleet's CA for that IP (a host that registered itself as a node at its
// own address) does not get the node token and the exec traffic.
func TestNodeDialerRole(t *testing.T) {
	p := mtlstest.New(t)
	d, err := nodeDialer(fleetTLSFlags{cert: p.Cert, key: p.Key, ca: p.CAFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(leaf mtlstest.Leaf) string {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf.Pair}, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Fatal(err)
		}
		serveOK(t, ln)
		return ln.Addr().String()
	}
	get := func(addr string) (string, error) {
		tr := &http.Transport{DialTLSContext: d.DialTLSContext}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if body, err := get(serve(p.Issue(t, "node", mtlstest.RoleNode))); err != nil || body != "ok" {
		t.Fatalf("a node's certificate: %q, %v; want served", body, err)
	}
	for _, c := range []struct {
		name  string
		roles []string
	}{
		{"the gateway role", []string{mtlstest.RoleGateway}},
		{"the Envoy role", []string{mtlstest.RoleEnvoy}},
		{"no role", nil},
	} {
		body, err := get(serve(p.Issue(t, strings.ReplaceAll(c.name, " ", "-"), c.roles...)))
		if err == nil {
			t.Errorf("a server with a certificate of %s: %q, want refused", c.name, body)
			continue
		}
		if !strings.Contains(err.Error(), "spiffe://wb/node") || !strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("a server with a certificate of %s: %v, want an error naming the role spiffe://wb/node and the SANs found", c.name, err)
		}
	}
}

// TestServeTLSMetrics: wb serve's /metrics reports the earliest expiry of its fleet TLS
// files (certificate and CA) and their failed reloads, from 0.
func TestServeTLSMetrics(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	p := mtlstest.New(t)
	_, _, ctx, stop, logs := startServeAuthz(t, "--metrics-addr", "127.0.0.1:0",
		"--fleet-tls-cert", p.Cert, "--fleet-tls-key", p.Key, "--fleet-tls-ca", p.CAFile)
	defer stop()
	urlRe := regexp.MustCompile(`msg="metrics served" url=(http://127\.0\.0\.1:\d+/metrics)`)
	testwait.For(t, 30*time.Second, "the metrics address in the log", func() bool { return urlRe.MatchString(logs.String()) })
	leaf, err := x509.ParseCertificate(p.Member.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	earliest := min(leaf.NotAfter.Unix(), p.CA.NotAfter.Unix())
	req, _ := http.NewRequestWithContext(ctx, "GET", urlRe.FindStringSubmatch(logs.String())[1], nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf(`wb_tls_cert_expiry_timestamp_seconds{cert="--fleet-tls-cert"} %s`, strconv.FormatFloat(float64(earliest), 'g', -1, 64)),
		`wb_tls_reload_failures_total{cert="--fleet-tls-cert"} 0`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(string(b), "wb_tls_"))
		}
	}
}

// grepLines answers the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestEnvoyIsNotLearnedAsGateway: over mutual TLS, a health check with the node token from a
// certificate that is not of the gateway role (an Envoy's: gatewaysOnly lets it reach
// /healthz) does not make the node take the caller's address for a gateway's and deny it to
// the guests; a gateway's certificate with the token still does.
func TestEnvoyIsNotLearnedAsGateway(t *testing.T) {
	p := mtlstest.New(t)
	platform := &platformAddrs{log: slog.New(slog.DiscardHandler)}
	h := gatewaysOnly(platform.learnGateways(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), "tok"), slog.New(slog.DiscardHandler))
	addr := serveNodeListener(t, p, h)
	learned := func() []string {
		platform.mu.Lock()
		defer platform.mu.Unlock()
		return addrStrings(platform.learned)
	}
	for _, c := range []struct {
		name string
		role string
		want []string
	}{
		{"the Envoy's certificate", mtlstest.RoleEnvoy, nil},
		{"a gateway's certificate", mtlstest.RoleGateway, []string{"127.0.0.1"}},
	} {
		tr := &http.Transport{TLSClientConfig: p.ClientConfig(p.Issue(t, strings.ReplaceAll(c.name, " ", "-"), c.role).Pair)}
		req, _ := http.NewRequest("GET", "https://"+addr+nodeapi.PathHealth, nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp.Body.Close()
		tr.CloseIdleConnections()
		if resp.StatusCode != 200 {
			t.Fatalf("GET /healthz with %s: %d", c.name, resp.StatusCode)
		}
		if got := learned(); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("after GET /healthz with %s and the node token, the gateways learned: %v; want %v", c.name, got, c.want)
		}
	}
}
