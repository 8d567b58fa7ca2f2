package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"wb/internal/mtls/mtlstest"
)

// serveHTTP serves "ok" over Server's TLS of p's member certificate on loopback, and answers
// its address.
func serveHTTP(t *testing.T, p mtlstest.PKI) string {
	t.Helper()
	cfg, err := Server(Files{Cert: p.Cert, Key: p.Key, CA: p.CAFile}, []string{"http/1.1"}, []string{RoleEnvoy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(tls.NewListener(ln, cfg)) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// get fetches https://addr/ with dialer's TLS.
func get(addr string, d *Dialer) (string, error) {
	hc := &http.Client{Transport: &http.Transport{DialTLSContext: d.DialTLSContext}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestDialer: a Dialer with a certificate of the server's CA is served; one whose certificate
// another CA signed is refused by the server, and one that trusts another CA refuses the
// server.
func TestDialer(t *testing.T) {
	p, other := mtlstest.New(t), mtlstest.New(t)
	addr := serveHTTP(t, p)
	dialer := func(cert, key, ca string) *Dialer {
		d, err := NewDialer(Files{Cert: cert, Key: key, CA: ca}, RoleNode, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if body, err := get(addr, dialer(p.ClientCert, p.ClientKey, p.CAFile)); err != nil || body != "ok" {
		t.Fatalf("a client of the CA: %q, %v; want ok", body, err)
	}
	if body, err := get(addr, dialer(p.OtherCert, p.OtherKey, p.CAFile)); err == nil {
		t.Errorf("a client certificate of another CA: %q, want refused", body)
	}
	if body, err := get(addr, dialer(other.ClientCert, other.ClientKey, other.CAFile)); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client that trusts another CA: %q, %v; want the server's certificate refused", body, err)
	}
	resp, err := http.Get("http://" + addr + "/")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("plaintext: %d, want refused", resp.StatusCode)
		}
	}
}

// TestFilesErrors: incomplete or broken files are refused, naming the flags.
func TestFilesErrors(t *testing.T) {
	p := mtlstest.New(t)
	names := Files{CertFlag: "--a-cert", KeyFlag: "--a-key", CAFlag: "--a-ca"}
	for _, c := range []struct {
		cert, key, ca, want string
	}{
		{p.Cert, p.Key, "", "--a-cert, --a-key and --a-ca go together"},
		{p.Cert, p.CAFile, p.CAFile, "--a-cert and --a-key"},
		{p.Cert, p.Key, p.Key, "--a-ca " + p.Key + ": no PEM certificate"},
	} {
		f := names
		f.Cert, f.Key, f.CA = c.cert, c.key, c.ca
		if _, err := NewDialer(f, RoleNode, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewDialer(%q, %q, %q) = %v, want an error with %q", c.cert, c.key, c.ca, err, c.want)
		}
	}
}

// TestDialHandshakeIsBounded: a server that accepts but never answers the handshake (a
// wedged process whose kernel still accepts) ends the dial within the handshake's bound.
// http.Transport gives the dial a context detached from the request's end, so the dial of a
// request that gave up long ago waited for good, with its goroutine and descriptor.
func TestDialHandshakeIsBounded(t *testing.T) {
	p := mtlstest.New(t)
	d, err := NewDialer(Files{Cert: p.Cert, Key: p.Key, CA: p.CAFile}, RoleNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.handshake = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // never read, never answered
		}
	}()
	defer func() {
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	}()
	hc := &http.Client{Transport: &http.Transport{DialTLSContext: d.DialTLSContext}}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "https://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hc.Do(req); err == nil {
		t.Fatal("a server that never answers answered")
	}
	// The request ended at 100 ms; the dial goes on in the Transport until its bound.
	dialing := func() int {
		buf := make([]byte, 1<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "mtls.(*Dialer).DialTLSContext")
	}
	deadline := time.Now().Add(20 * time.Second)
	for dialing() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after a request that ended at 100 ms, %d dials still wait for the handshake", dialing())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRoles: mtlstest's roles are this package's; a server or dialer without a role is
// refused; a refusal names the roles expected and every SAN the certificate has.
func TestRoles(t *testing.T) {
	if mtlstest.RoleNode != RoleNode || mtlstest.RoleGateway != RoleGateway || mtlstest.RoleEnvoy != RoleEnvoy {
		t.Fatal("mtlstest's roles are not mtls's")
	}
	p := mtlstest.New(t)
	f := Files{Cert: p.Cert, Key: p.Key, CA: p.CAFile}
	if _, err := Server(f, nil, nil, nil); err == nil {
		t.Error("a server that takes clients of no role was made")
	}
	if _, err := NewDialer(f, "", nil); err == nil {
		t.Error("a dialer of servers of no role was made")
	}
	u, _ := url.Parse(RoleNode)
	c := &x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, URIs: []*url.URL{u}, DNSNames: []string{"n1.wb"}, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}}
	err := checkRole([]*x509.Certificate{c}, "client", []string{RoleEnvoy, RoleGateway})
	want := `the client's certificate (CN "n1") is not of the role spiffe://wb/envoy or spiffe://wb/gateway: it has URI SANs [spiffe://wb/node], DNS SANs [n1.wb] and IP SANs [10.0.0.1]`
	if err == nil || err.Error() != want {
		t.Errorf("checkRole: %v, want %s", err, want)
	}
	if err := checkRole([]*x509.Certificate{c}, "client", []string{RoleEnvoy, RoleNode}); err != nil {
		t.Errorf("checkRole of one of the roles: %v", err)
	}
	if err := checkRole(nil, "client", []string{RoleEnvoy}); err == nil {
		t.Error("checkRole of no certificate passed")
	}
}

// TestHasRole: a handler behind Server's TLS reads each client's roles from the request's
// verified chain: the Envoy's, the gateway's, both, and none for a request without TLS.
func TestHasRole(t *testing.T) {
	p := mtlstest.New(t)
	cfg, err := Server(Files{Cert: p.Cert, Key: p.Key, CA: p.CAFile}, []string{"http/1.1"}, []string{RoleEnvoy, RoleGateway}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var chain []*x509.Certificate
		if r.TLS != nil {
			chain = r.TLS.PeerCertificates
		}
		_, _ = io.WriteString(w, strings.Join(Roles(chain), ",")+fmt.Sprintf(" envoy=%v gateway=%v", HasRole(chain, RoleEnvoy), HasRole(chain, RoleGateway)))
	})}
	go func() { _ = srv.Serve(tls.NewListener(ln, cfg)) }()
	defer srv.Close()
	for _, c := range []struct {
		name  string
		roles []string
		want  string
	}{
		{"the Envoy role", []string{RoleEnvoy}, RoleEnvoy + " envoy=true gateway=false"},
		{"the gateway role", []string{RoleGateway}, RoleGateway + " envoy=false gateway=true"},
		{"both, and a URI SAN of no role", []string{RoleEnvoy, "spiffe://other/x", RoleGateway}, RoleGateway + "," + RoleEnvoy + " envoy=true gateway=true"},
	} {
		leaf := p.Issue(t, strings.ReplaceAll(c.name, " ", "-"), c.roles...)
		tr := &http.Transport{TLSClientConfig: p.ClientConfig(leaf.Pair)}
		resp, err := (&http.Client{Transport: tr}).Get("https://" + ln.Addr().String() + "/")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		if err != nil || string(b) != c.want {
			t.Errorf("a client of %s: the handler read %q (%v), want %q", c.name, b, err, c.want)
		}
	}
	if HasRole(nil, RoleEnvoy) || Roles(nil) != nil {
		t.Error("no chain names a role")
	}
}

// TestMint: Mint's CA and members serve and dial each other by their roles: a gateway's
// certificate calls a node's listener and finds the node role, an Envoy's is served, and
// another node's is refused; the keys are private to their owner, and no CA key is left.
func TestMint(t *testing.T) {
	dir := t.TempDir()
	local := []net.IP{net.IPv4(127, 0, 0, 1)}
	if err := Mint(dir, time.Hour, []Member{
		{Name: "node", Roles: []string{RoleNode}, IPs: local},
		{Name: "gateway", Roles: []string{RoleGateway}, IPs: local},
		{Name: "envoy", Roles: []string{RoleEnvoy}},
	}); err != nil {
		t.Fatal(err)
	}
	files := func(name string) Files {
		return Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, "ca.pem")}
	}
	cfg, err := Server(files("node"), []string{"http/1.1"}, []string{RoleEnvoy, RoleGateway}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
	go func() { _ = srv.Serve(tls.NewListener(ln, cfg)) }()
	defer srv.Close()
	for _, c := range []struct {
		client string
		ok     bool
	}{{"gateway", true}, {"envoy", true}, {"node", false}} {
		d, err := NewDialer(files(c.client), RoleNode, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := get(ln.Addr().String(), d)
		if ok := err == nil && body == "ok"; ok != c.ok {
			t.Errorf("the %s's certificate calling the node: %q, %v; want served %v", c.client, body, err, c.ok)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(e.Name(), "-key.pem") && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", e.Name(), fi.Mode().Perm())
		}
	}
	want := []string{"ca.pem", "envoy-key.pem", "envoy.pem", "gateway-key.pem", "gateway.pem", "node-key.pem", "node.pem"}
	if !slices.Equal(names, want) {
		t.Errorf("files %v, want %v (and no CA key)", names, want)
	}
	for _, bad := range []Member{{Name: "ca"}, {Name: "../x"}, {Name: "x", Roles: []string{"node"}}} {
		if err := Mint(t.TempDir(), time.Hour, []Member{bad}); err == nil {
			t.Errorf("Mint of %+v: no error", bad)
		}
	}
}

// TestMetrics: a Server and a Dialer of Files with Metrics report the earliest NotAfter of
// their certificates and CA, by the certificate's flag, and count a change of the files that
// does not load (the last good expiry stays); a rotation that loads reports the new expiry.
func TestMetrics(t *testing.T) {
	dir := t.TempDir()
	local := []net.IP{net.IPv4(127, 0, 0, 1)}
	mint := func(sub string, validity time.Duration) string {
		d := filepath.Join(dir, sub)
		if err := Mint(d, validity, []Member{{Name: "m", Roles: []string{RoleNode, RoleEnvoy}, IPs: local}}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	notAfter := func(d string) float64 {
		b, err := os.ReadFile(filepath.Join(d, "m.pem"))
		if err != nil {
			t.Fatal(err)
		}
		blk, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return float64(c.NotAfter.Unix())
	}
	first, second := mint("a", 48*time.Hour), mint("b", 24*time.Hour)
	cur := filepath.Join(dir, "cur")
	install := func(src string, age time.Duration) {
		if err := os.MkdirAll(cur, 0o700); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"m.pem", "m-key.pem", "ca.pem"} {
			b, err := os.ReadFile(filepath.Join(src, n))
			if err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(cur, n), b, age)
		}
	}
	install(first, -time.Hour)
	m := NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	f := Files{Cert: filepath.Join(cur, "m.pem"), Key: filepath.Join(cur, "m-key.pem"), CA: filepath.Join(cur, "ca.pem"), CertFlag: "--fleet-tls-cert", Metrics: m}
	if _, err := Server(f, nil, []string{RoleEnvoy}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := NewDialer(f, RoleNode, nil); err != nil {
		t.Fatal(err)
	}
	expiry := func() float64 {
		return testutil.ToFloat64(prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
			mc := make(chan prometheus.Metric, 16)
			m.Collect(mc)
			close(mc)
			for x := range mc {
				if strings.Contains(x.Desc().String(), "wb_tls_cert_expiry_timestamp_seconds") {
					ch <- x
				}
			}
		}))
	}
	failures := func() float64 { return testutil.ToFloat64(m.failures.WithLabelValues("--fleet-tls-cert")) }
	if got, want := expiry(), notAfter(first); got != want || failures() != 0 {
		t.Fatalf("loaded: expiry %v, want %v; %v failures, want 0", got, want, failures())
	}

	write(t, f.Key, []byte("half written"), -30*time.Minute)
	if got, want := expiry(), notAfter(first); got != want {
		t.Errorf("after a key that does not load: expiry %v, want the last good %v", got, want)
	}
	// The server and the dialer each saw the change once.
	if got := failures(); got != 2 {
		t.Errorf("after a key that does not load: %v failures, want 2 (the server's and the dialer's)", got)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP wb_tls_reload_failures_total Changes of a member's TLS files that did not load (the last good ones stayed in use), by the flag of the certificate.
# TYPE wb_tls_reload_failures_total counter
wb_tls_reload_failures_total{cert="--fleet-tls-cert"} 2
`), "wb_tls_reload_failures_total"); err != nil {
		t.Error(err)
	}

	install(second, 0)
	if got, want := expiry(), notAfter(second); got != want {
		t.Errorf("after a rotation: expiry %v, want %v", got, want)
	}
	if got := failures(); got != 2 {
		t.Errorf("after a rotation that loads: %v failures, want still 2", got)
	}
}

// write writes b to path, with a modification time age from now (distinct times, whatever
// the file system's clock resolution).
func write(t *testing.T, path string, b []byte, age time.Duration) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(age)
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}
