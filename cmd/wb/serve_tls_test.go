//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"wb/internal/redistest"
	"wb/internal/syncbuf"
	"wb/internal/testwait"
	"wb/store"
)

// pebble is an ACME CA (Pebble's own CA, VA and WFE, in this process) whose directory is
// served over HTTPS on loopback.
type pebble struct {
	dirURL string         // ACME directory
	caRoot string         // PEM file of the cert that verifies dirURL's HTTPS (--acme-ca-root)
	roots  *x509.CertPool // the CA's issuing root: verifies the certificates it issues
	orders atomic.Int32   // new-order requests received
	log    syncbuf.Buffer // Pebble's log
}

// startPebble runs Pebble, its VA validating TLS-ALPN-01 on tlsPort of the address its own
// resolver gives: 127.0.0.1 for localhost, and no address for any other name, so whatever a
// test asks it never dials beyond loopback.
func startPebble(t *testing.T, tlsPort int) *pebble {
	t.Helper()
	t.Setenv("PEBBLE_VA_NOSLEEP", "1")      // validate at once, not after a random sleep
	t.Setenv("PEBBLE_WFE_NONCEREJECT", "0") // reject no good nonce (the default rejects 5 %)
	p := &pebble{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pebble's log:\n%s", p.log.String())
		}
	})
	logger := log.New(&p.log, "pebble ", log.Lmicroseconds)

	resolver := startLoopbackDNS(t)
	store := db.NewMemoryStore()
	authority := ca.New(logger, store, "", "ecdsa", 0, 1, map[string]ca.Profile{"default": {Description: "the default profile"}})
	validator := va.New(logger, 0, tlsPort, false, resolver, store)
	frontEnd := wfe.New(logger, store, validator, authority, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)
	acme := frontEnd.Handler()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/order-plz" { // Pebble's new-order path
			p.orders.Add(1)
		}
		acme.ServeHTTP(w, r)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)

	p.dirURL = srv.URL + wfe.DirectoryPath
	p.caRoot = filepath.Join(t.TempDir(), "pebble-https.pem")
	if err := os.WriteFile(p.caRoot, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	p.roots = x509.NewCertPool()
	p.roots.AddCert(authority.GetRootCert(0).Cert)
	return p
}

// startLoopbackDNS serves DNS over TCP on loopback for Pebble's VA: localhost is 127.0.0.1,
// every other name has no address.
func startLoopbackDNS(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{Listener: ln, Net: "tcp", Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, question := range q.Question {
			if question.Qtype == dns.TypeA && strings.EqualFold(question.Name, "localhost.") {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(127, 0, 0, 1)})
			}
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// handshake dials addr for serverName and verifies its certificate against roots; it answers
// the leaf.
func handshake(addr, serverName string, roots *x509.CertPool) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{ServerName: serverName, RootCAs: roots})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// TestServeTLS: `wb serve --tls-domain localhost` gets a certificate from an ACME CA
// (Pebble, TLS-ALPN-01 on the public listener) and serves the API over HTTPS with it; a second
// gateway on the same Redis serves the same certificate without another order; an on-demand
// gateway serves it for its allowed name and refuses a handshake for any other, without
// asking the CA.
func TestServeTLS(t *testing.T) {
	redisURL := "redis://" + redistest.ServerAddr(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addrA := ln.Addr().String()
	ln.Close() // Pebble's VA must know the port before the gateway that listens on it starts
	acme := startPebble(t, ln.Addr().(*net.TCPAddr).Port)
	common := []string{"--redis", redisURL, "--acme-ca", acme.dirURL, "--acme-ca-root", acme.caRoot, "--tls-domain", "localhost"}

	envA := startServe(t, append(common, "--addr", addrA)...)
	if envA["WB_URL"] != "https://"+addrA {
		t.Fatalf("WB_URL %q, want https://%s", envA["WB_URL"], addrA)
	}
	var leafA *x509.Certificate
	testwait.For(t, 3*time.Minute, "gateway A to serve a certificate for localhost from Pebble", func() bool {
		leafA, err = handshake(addrA, "localhost", acme.roots)
		return err == nil
	})
	if n := acme.orders.Load(); n != 1 {
		t.Fatalf("%d orders at the CA, want 1", n)
	}

	// The API over the verified TLS, HTTP/2 offered.
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: acme.roots},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addrA)
		},
	}}
	req, _ := http.NewRequest("GET", "https://localhost/v1/templates", nil)
	req.Header.Set("Authorization", "Bearer "+envA["WB_API_KEY"])
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || !strings.Contains(string(body), "tpl_base") {
		t.Fatalf("GET /v1/templates over TLS: %s %d %s", resp.Proto, resp.StatusCode, body)
	}

	envB := startServe(t, common...)
	addrB := strings.TrimPrefix(envB["WB_URL"], "https://")
	var leafB *x509.Certificate
	testwait.For(t, 3*time.Minute, "gateway B to serve localhost's certificate from Redis", func() bool {
		leafB, err = handshake(addrB, "localhost", acme.roots)
		return err == nil
	})
	if !leafB.Equal(leafA) {
		t.Fatalf("gateway B serves certificate %s, gateway A %s", leafB.SerialNumber, leafA.SerialNumber)
	}

	envC := startServe(t, append(common, "--tls-on-demand")...)
	addrC := strings.TrimPrefix(envC["WB_URL"], "https://")
	testwait.For(t, 3*time.Minute, "on-demand gateway C to serve localhost's certificate from Redis", func() bool {
		leaf, err := handshake(addrC, "localhost", acme.roots)
		return err == nil && leaf.Equal(leafA)
	})
	// Any certificate at all, verified or not, would be a failure.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addrC, &tls.Config{ServerName: "denied.example", InsecureSkipVerify: true})
	if err == nil {
		conn.Close()
		t.Fatal("on-demand TLS served a name that --tls-domain does not allow")
	}
	if n := acme.orders.Load(); n != 1 {
		t.Fatalf("%d orders at the CA after three gateways, want 1", n)
	}
}

// TestTLSFlags: contradictory TLS flags are refused before anything starts, and on-demand TLS
// allows only --tls-domain's names and one label under its *.DOMAIN patterns.
func TestTLSFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--tls-on-demand"},
		{"--tls-domain", "*.example.com"},
		{"--acme-email", "ops@example.com"},
		{"--acme-ca", "https://127.0.0.1:14000/dir"},
		{"--tls-domain", "https://example.com"},
		{"--tls-domain", "example.com:443"},
		{"--tls-domain", "127.0.0.1"},
		{"--tls-domain", ""},
	} {
		err := run(context.Background(), append([]string{"serve", "--data-dir", t.TempDir()}, args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "tls-") && !strings.Contains(err.Error(), "acme") {
			t.Errorf("wb serve %q: %v; want an error naming the flag", args, err)
		}
	}

	f := tlsFlags{domains: []string{"api.example.com", "*.sessions.example.com"}, onDemand: true}
	if err := f.check(); err != nil {
		t.Fatal(err)
	}
	for name, allowed := range map[string]bool{
		"api.example.com": true, "API.Example.com": true, "a1.sessions.example.com": true,
		"example.com": false, "x.api.example.com": false, "sessions.example.com": false,
		"a.b.sessions.example.com": false, "denied.example": false,
	} {
		if err := f.allow(context.Background(), name); (err == nil) != allowed {
			t.Errorf("on-demand decision for %q: %v, want allowed=%v", name, err, allowed)
		}
	}
}

// TestCertmagicLogs: certmagic's zap logs reach slog with their level, message, fields and
// logger name, and below slog's level they are dropped.
func TestCertmagicLogs(t *testing.T) {
	var buf bytes.Buffer
	zl := zap.New(slogCore{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	zl.Named("obtain").Debug("hidden")
	zl.Named("obtain").With(zap.Int("attempt", 2)).Warn("retrying", zap.String("identifier", "localhost"))
	if got := buf.String(); strings.Contains(got, "hidden") || !strings.Contains(got, `level=WARN msg=retrying attempt=2 identifier=localhost logger=obtain`) {
		t.Fatalf("slog got %q", got)
	}
}

// startReplica serves TLS on ln as one gateway replica does: its own Redis client, certmagic
// config and cache, over the shared Redis at redisAddr.
func startReplica(t *testing.T, ln net.Listener, redisAddr string, f tlsFlags) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tlsLn, stop, err := f.listen(ctx, ln, store.New(rdb), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	go func() { _ = srv.Serve(tlsLn) }()
	t.Cleanup(func() { srv.Close() })
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestTLSReplicas: the CA's validation may reach any replica behind the public name, not the
// one that ordered; and replicas that start together order one certificate between them.
func TestTLSReplicas(t *testing.T) {
	acmeFlags := func(p *pebble, onDemand bool) tlsFlags {
		return tlsFlags{domains: []string{"localhost"}, onDemand: onDemand, caURL: p.dirURL, caRoot: p.caRoot}
	}

	t.Run("another replica answers the challenge", func(t *testing.T) {
		redisAddr := redistest.ServerAddr(t)
		validated, ordering := listenLoopback(t), listenLoopback(t)
		acme := startPebble(t, validated.Addr().(*net.TCPAddr).Port)
		// The replica the CA dials orders nothing (on-demand, and no handshake asks it for
		// localhost until the end); the other orders, and its challenge answer is in Redis.
		startReplica(t, validated, redisAddr, acmeFlags(acme, true))
		startReplica(t, ordering, redisAddr, acmeFlags(acme, false))
		var leaf *x509.Certificate
		testwait.For(t, 3*time.Minute, "the ordering replica to serve localhost's certificate", func() bool {
			var err error
			leaf, err = handshake(ordering.Addr().String(), "localhost", acme.roots)
			return err == nil
		})
		if got, err := handshake(validated.Addr().String(), "localhost", acme.roots); err != nil || !got.Equal(leaf) {
			t.Fatalf("the other replica: %v", err)
		}
		if n := acme.orders.Load(); n != 1 {
			t.Fatalf("%d orders at the CA, want 1", n)
		}
	})

	t.Run("replicas starting together order once", func(t *testing.T) {
		redisAddr := redistest.ServerAddr(t)
		lns := []net.Listener{listenLoopback(t), listenLoopback(t), listenLoopback(t)}
		acme := startPebble(t, lns[0].Addr().(*net.TCPAddr).Port)
		var wg sync.WaitGroup
		for _, ln := range lns {
			wg.Go(func() { startReplica(t, ln, redisAddr, acmeFlags(acme, false)) })
		}
		wg.Wait()
		var first *x509.Certificate
		for i, ln := range lns {
			testwait.For(t, 3*time.Minute, fmt.Sprintf("replica %d to serve localhost's certificate", i), func() bool {
				leaf, err := handshake(ln.Addr().String(), "localhost", acme.roots)
				if err != nil {
					return false
				}
				if first == nil {
					first = leaf
				}
				return leaf.Equal(first)
			})
		}
		if n := acme.orders.Load(); n != 1 {
			t.Fatalf("%d orders at the CA from three replicas, want 1", n)
		}
	})
}
