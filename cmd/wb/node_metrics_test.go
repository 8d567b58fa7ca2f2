//go:build linux

package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/internal/fleet"
	"wb/internal/mtls/mtlstest"
	"wb/internal/redistest"
	"wb/internal/syncbuf"
	"wb/internal/testwait"
)

// TestNodeMetrics: wb node --metrics-addr serves /metrics there, without a key: the earliest
// expiry of its fleet TLS files (certificate and CA) and their failed reloads, from 0, its
// execs under way and its requests to the guests' agents by kind and outcome, and the edge's
// data path's requests by route and status; the node API serves no /metrics. Before, wb node
// served no metrics at all, and then none of its data path's requests.
func TestNodeMetrics(t *testing.T) {
	tmp, bin := runcGuestDir(t, "wbm")
	dataDir := filepath.Join(tmp, "d")
	const nodeID = "node_metrics"
	t.Cleanup(func() {
		if err := fleet.Reap(context.Background(), "runc", dataDir, nodeID); err != nil {
			t.Logf("wb node's guests: %v", err)
		}
		fleet.UnmountUnder(tmp)
	})
	tokenFile := filepath.Join(tmp, "token")
	if err := os.WriteFile(tokenFile, []byte("wb_node_metrics"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := mtlstest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncbuf.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"node", "--redis", "redis://" + redistest.ServerAddr(t), "--token-file", tokenFile, "--id", nodeID,
			"--addr", "127.0.0.1:0", "--runtime", "runc", "--pool", "0", "--run-pool", "0", "--desktop-pool", "0",
			"--data-dir", dataDir, "--agent-bin", filepath.Join(filepath.Dir(bin), "wb-agent"), "--metrics-addr", "127.0.0.1:0",
			"--fleet-tls-cert", p.Cert, "--fleet-tls-key", p.Key, "--fleet-tls-ca", p.CAFile}, io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("wb node: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("wb node did not stop within a minute of its context ending")
		}
	})
	metricsRe := regexp.MustCompile(`msg="metrics served" url=(http://127\.0\.0\.1:\d+/metrics)`)
	apiRe := regexp.MustCompile(`msg="node ready" .*addr=(https://127\.0\.0\.1:\d+)`)
	testwait.For(t, 2*time.Minute, "the metrics and API addresses in wb node's log", func() bool {
		select {
		case err := <-done:
			done <- err // for the cleanup's wait
			t.Fatalf("wb node ended: %v\n%s", err, logs.String())
		default:
		}
		return metricsRe.MatchString(logs.String()) && apiRe.MatchString(logs.String())
	})
	metricsURL := metricsRe.FindStringSubmatch(logs.String())[1]
	apiURL := apiRe.FindStringSubmatch(logs.String())[1]

	// A gateway's call (its role's certificate, the node token) to a session the node does
	// not run: an exec the node rejects.
	gateway := &http.Client{Transport: &http.Transport{TLSClientConfig: p.ClientConfig(p.Member)}}
	call := func(method, path, token string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, apiURL+path, strings.NewReader(`{"argv":["true"]}`))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := gateway.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := call("POST", "/v1/sessions/sess_nosuchsession/agent/v1/exec", "wb_node_metrics"); got != http.StatusNotFound {
		t.Errorf("an exec of a session the node does not run: %d, want 404", got)
	}
	// An exec on the edge's data path without the edge's grant: refused before the guests.
	if got := call("POST", "/v1/sessions/sess_nosuchsession/exec", ""); got != http.StatusUnauthorized {
		t.Errorf("an exec on the data path without a grant: %d, want 401", got)
	}
	for token, want := range map[string]int{"": 401, "wb_node_metrics": 404} {
		if got := call("GET", "/metrics", token); got != want {
			t.Errorf("the node API's /metrics with token %q: %d, want %d", token, got, want)
		}
	}

	leaf, err := x509.ParseCertificate(p.Member.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	earliest := min(leaf.NotAfter.Unix(), p.CA.NotAfter.Unix())
	req, _ := http.NewRequestWithContext(ctx, "GET", metricsURL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", metricsURL, resp.StatusCode, err)
	}
	for _, want := range []string{
		fmt.Sprintf(`wb_tls_cert_expiry_timestamp_seconds{cert="--fleet-tls-cert"} %s`, strconv.FormatFloat(float64(earliest), 'g', -1, 64)),
		`wb_tls_reload_failures_total{cert="--fleet-tls-cert"} 0`,
		`wb_node_execs_in_progress 0`,
		`wb_node_agent_requests_total{kind="exec",outcome="rejected"} 1`,
		`wb_http_requests_total{method="POST",route="POST /v1/sessions/{id}/exec",status="401"} 1`,
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(string(b), "wb_"))
		}
	}
}
