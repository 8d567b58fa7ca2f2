package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"wb/internal/mtls/mtlstest"
	"wb/internal/syncbuf"
	"wb/internal/testwait"
)

// TestServeAuthz: `wb serve --authz-addr` serves ext_authz over gRPC for the API it serves:
// a session created through the API is known to it by key and by its connect token (409:
// with no node it stays pending), an unknown one answers 404 and a bad key 401.
func TestServeAuthz(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	env, addr, ctx, stop, _ := startServeAuthz(t)
	defer stop()
	req, _ := http.NewRequest("POST", env["WB_URL"]+"/v1/sessions", strings.NewReader(`{"tier":2}`))
	req.Header.Set("Authorization", "Bearer "+env["WB_API_KEY"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sess struct {
		ID      string `json:"id"`
		Connect struct {
			ExecURL string `json:"exec_url"`
		} `json:"connect"`
	}
	err = json.NewDecoder(resp.Body).Decode(&sess)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	u, err := url.Parse(sess.Connect.ExecURL)
	if err != nil {
		t.Fatal(err)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	checkStatus := func(path, key string) (int, string) {
		t.Helper()
		hdr := map[string]string{}
		if key != "" {
			hdr["authorization"] = "Bearer " + key
		}
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		r, err := client.Check(cctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: path, Headers: hdr}}}})
		if err != nil {
			t.Fatalf("Check %s: %v", path, err)
		}
		return int(r.GetDeniedResponse().GetStatus().GetCode()), r.GetDeniedResponse().GetBody()
	}
	if st, body := checkStatus("/v1/sessions/"+sess.ID+"/exec", env["WB_API_KEY"]); st != 409 || !strings.Contains(body, "session is pending") {
		t.Errorf("by key: %d %s, want 409 pending", st, body)
	}
	if st, body := checkStatus(u.RequestURI(), ""); st != 409 || !strings.Contains(body, "session is pending") {
		t.Errorf("by the connect URL's token: %d %s, want 409 pending", st, body)
	}
	if st, _ := checkStatus("/v1/sessions/sess_nope/exec", env["WB_API_KEY"]); st != 404 {
		t.Errorf("unknown session: %d, want 404", st)
	}
	if st, _ := checkStatus("/v1/sessions/"+sess.ID+"/exec", "wb_live_nope"); st != 401 {
		t.Errorf("bad key: %d, want 401", st)
	}
	stop()
}

// startServeAuthz runs `wb serve --authz-addr 127.0.0.1:0 --runtime none` with args added, and
// answers its three lines, its ext_authz address, its context, and stop, which ends it and
// fails the test unless it stops cleanly (calling it again does nothing).
func startServeAuthz(t *testing.T, args ...string) (env map[string]string, addr string, ctx context.Context, stop func(), logs *syncbuf.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	logs = &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0", "--authz-addr", "127.0.0.1:0", "--runtime", "none",
			"--data-dir", t.TempDir(), "--log-level", "info"}, args...), pw, logs)
		pw.Close()
	}()
	env = map[string]string{}
	lines := make(chan struct{})
	go func() {
		b := make([]byte, 4096)
		var got string
		for strings.Count(got, "\n") < 3 {
			n, err := pr.Read(b)
			if err != nil {
				break
			}
			got += string(b[:n])
		}
		for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
			k, v, _ := strings.Cut(l, "=")
			env[k] = v
		}
		close(lines)
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case <-lines:
	case <-time.After(60 * time.Second):
		t.Fatal("wb serve printed nothing in 60 s")
	}
	addrRe := regexp.MustCompile(`msg="ext_authz served" addr=(127\.0\.0\.1:\d+)`)
	testwait.For(t, 30*time.Second, "the ext_authz address in the log", func() bool { return addrRe.MatchString(logs.String()) })
	addr = addrRe.FindStringSubmatch(logs.String())[1]

	stopped := false
	stop = func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("serve returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop within 30 s of its context ending")
		}
	}
	return env, addr, ctx, stop, logs
}

// TestServeAuthzFleetTLS: with `wb serve --fleet-tls-*`, ext_authz answers only over TLS, to a
// client whose certificate the fleet's CA signed for the Envoy role (an Envoy of
// --envoy-tls-*); plaintext, no certificate, another CA's certificate and the fleet CA's
// certificate of a node (a compromised node host has one) get no answer, and no grant.
func TestServeAuthzFleetTLS(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	pki := mtlstest.New(t)
	_, addr, ctx, stop, _ := startServeAuthz(t, "--fleet-tls-cert", pki.Cert, "--fleet-tls-key", pki.Key, "--fleet-tls-ca", pki.CAFile)
	defer stop()
	check := func(creds credentials.TransportCredentials) (int, error) {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		r, err := authv3.NewAuthorizationClient(conn).Check(cctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/v1/sessions/sess_nope/exec", Headers: map[string]string{"authorization": "Bearer wb_live_nope"}}}}})
		return int(r.GetDeniedResponse().GetStatus().GetCode()), err
	}
	// The certificate is sent whatever CAs the server names (Go's client would send none of
	// another CA's).
	withCert := func(certs ...tls.Certificate) credentials.TransportCredentials {
		cfg := pki.ClientConfig()
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if len(certs) == 0 {
				return &tls.Certificate{}, nil
			}
			return &certs[0], nil
		}
		return credentials.NewTLS(cfg)
	}
	if st, err := check(withCert(pki.Client)); err != nil || st != 401 {
		t.Fatalf("an Envoy with the fleet CA's certificate: %d, %v; want a 401 answer for a bad key", st, err)
	}
	for _, c := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plaintext", insecure.NewCredentials()},
		{"TLS without a client certificate", withCert()},
		{"a client certificate of another CA", withCert(pki.Other)},
		{"a node's certificate of the fleet CA", withCert(pki.Issue(t, "node", mtlstest.RoleNode).Pair)},
	} {
		if st, err := check(c.creds); err == nil {
			t.Errorf("%s: answered %d, want refused", c.name, st)
		}
	}
}

// TestServeEdgeAddr: `wb serve --edge-addr` serves the API to the Envoys over mutual TLS only:
// a client with the fleet CA's certificate lists sessions with an API key; plaintext, no
// certificate and another CA's certificate get nothing. Without --fleet-tls-* it is refused.
func TestServeEdgeAddr(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	pki := mtlstest.New(t)
	env, _, ctx, stop, logs := startServeAuthz(t, "--edge-addr", "127.0.0.1:0",
		"--fleet-tls-cert", pki.Cert, "--fleet-tls-key", pki.Key, "--fleet-tls-ca", pki.CAFile)
	defer stop()
	edgeRe := regexp.MustCompile(`msg="edge API served" addr=(127\.0\.0\.1:\d+)`)
	testwait.For(t, 30*time.Second, "the edge address in the log", func() bool { return edgeRe.MatchString(logs.String()) })
	edge := edgeRe.FindStringSubmatch(logs.String())[1]

	list := func(hc *http.Client, scheme string) (int, error) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, "GET", scheme+"://"+edge+"/v1/sessions", nil)
		req.Header.Set("Authorization", "Bearer "+env["WB_API_KEY"])
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// The certificate is sent whatever CAs the server names.
	withCert := func(certs ...tls.Certificate) *http.Client {
		cfg := pki.ClientConfig()
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if len(certs) == 0 {
				return &tls.Certificate{}, nil
			}
			return &certs[0], nil
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	if st, err := list(withCert(pki.Client), "https"); err != nil || st != 200 {
		t.Fatalf("an Envoy with the fleet CA's certificate: %d, %v; want 200", st, err)
	}
	for _, c := range []struct {
		name   string
		hc     *http.Client
		scheme string
	}{
		{"plaintext", http.DefaultClient, "http"},
		{"TLS without a client certificate", withCert(), "https"},
		{"a client certificate of another CA", withCert(pki.Other), "https"},
	} {
		if st, err := list(c.hc, c.scheme); err == nil && st != 400 {
			t.Errorf("%s: %d, want refused", c.name, st)
		}
	}
	stop()

	var out, errb strings.Builder
	err := run(context.Background(), []string{"serve", "--edge-addr", "127.0.0.1:0", "--runtime", "none", "--data-dir", t.TempDir()}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "--edge-addr serves only mutual TLS") {
		t.Errorf("--edge-addr without --fleet-tls-*: %v", err)
	}
}
