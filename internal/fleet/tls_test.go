package fleet_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/client"
	"wb/internal/fleet"
	"wb/internal/wbbin"
	"wb/session"
	"wb/store"
)

// TestStartTLS: a fleet started with Options.TLS (wb fleet --tls) runs its nodes on mutual
// TLS, with the certificates it minted: the node registers an https:// URL, an exec through
// the gateway reaches the guest (the gateway calls the node over mutual TLS), and a client
// without a certificate of the fleet's CA gets nothing from the node.
func TestStartTLS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runc guests need root")
	}
	for _, bin := range []string{"runc", "busybox", "redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	// Not t.TempDir(): the test's name would make the guests' Unix socket paths too long.
	tmp, err := os.MkdirTemp("", "wbt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil { // the guests' user reaches the agent binary
		t.Fatal(err)
	}
	bin, err := wbbin.Install(tmp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	f, err := fleet.Start(ctx, fleet.Options{Dir: filepath.Join(tmp, "f"), Bin: bin, Nodes: 1, Gateways: 1,
		NodeVCPU: 2, NodeMemoryMiB: 4096, TLS: true, Logf: t.Logf,
		// A loaded machine boots guests slowly: the pending session must outlive it.
		NodeArgs: []string{"--cold-p95", "2=20s"}, GatewayArgs: []string{"--cold-p95", "2=20s"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleet logs:\n%s", f.Logs())
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Errorf("fleet stop: %v", err)
		}
	})
	if f.TLSDir == "" {
		t.Fatal("a fleet with TLS has no TLSDir")
	}
	nodes, err := store.New(f.Redis).Nodes(ctx)
	if err != nil || len(nodes) != 1 || !strings.HasPrefix(nodes[0].Addr, "https://127.0.0.1:") {
		t.Fatalf("the nodes registered: %+v, %v; want one at https://127.0.0.1:PORT", nodes, err)
	}

	c, err := client.New(f.GatewayURLs[0], f.APIKey)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.CreateSession(ctx, client.CreateSessionRequest{Tier: 2, Resources: &client.ResourceRequest{SizeClass: "s"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitSession(ctx, s.ID, session.Running); err != nil {
		t.Fatalf("session %s: %v", s.ID, err)
	}
	res, err := c.Exec(ctx, s.ID, client.ExecRequest{Command: "echo over-mtls"})
	if err != nil || res.ExitCode != 0 || res.Stdout != "over-mtls\n" {
		t.Fatalf("exec through the gateway: %+v, %v", res, err)
	}

	// The node answers nothing to a client that trusts its CA but presents no certificate.
	pem, err := os.ReadFile(filepath.Join(f.TLSDir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Get(nodes[0].Addr + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("a client without a certificate: %d from the node, want refused", resp.StatusCode)
	}

	// The node answers by the caller's role: the Envoys' certificate reaches its health check
	// (and the edge's data path) but none of the node API, which the gateways' reaches (up to
	// the node token, which this caller does not send).
	as := func(member, method, path string) (int, string) {
		t.Helper()
		cert, err := tls.LoadX509KeyPair(filepath.Join(f.TLSDir, member+".pem"), filepath.Join(f.TLSDir, member+"-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
		defer tr.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, method, nodes[0].Addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("%s %s as the %s: %v", method, path, member, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		member, method, path string
		status               int
		says                 string
	}{
		{"envoy", "GET", "/healthz", 200, `"ok"`},
		{"envoy", "POST", "/v1/provision", 403, `"forbidden"`},
		{"envoy", "POST", "/v1/sessions/" + s.ID + ":stop", 403, "spiffe://wb/envoy"},
		{"gateway", "GET", "/healthz", 200, `"ok"`},
		{"gateway", "POST", "/v1/sessions/" + s.ID + ":stop", 401, "bad or missing token"},
	} {
		if status, body := as(tc.member, tc.method, tc.path); status != tc.status || !strings.Contains(body, tc.says) {
			t.Errorf("%s %s as the %s: %d %s; want %d saying %s", tc.method, tc.path, tc.member, status, body, tc.status, tc.says)
		}
	}
	if got, err := c.GetSession(ctx, s.ID); err != nil || got.State != session.Running {
		t.Errorf("after the Envoy's stop: %+v, %v; want the session running", got, err)
	}
}
