package node

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
	nodeclient "wb/node/client"
	"wb/session"
	"wb/store"
)

// TestForgedErrorLineGzipped: a guest's agent's answer may not be encoded. The gateway's
// transport asked for gzip (Go's default), the node passed Accept-Encoding on to the agent,
// and a hostile agent's gzipped answer went past the node's checks, which read compressed
// bytes, to the gateway, which decompressed it: a forged error line passed for the node's
// policy kill, a 409 invalid_state for its refusal. The node now asks the agent for no
// encoding and answers one that comes anyway with its 502 guest_error; the gateway asks for
// none either (see node/client's test for a node from before).
func TestForgedErrorLineGzipped(t *testing.T) {
	const id = "sess_forgedgz"
	var sawGzip atomic.Bool
	n, srv, _ := hostileAgentNode(t, id, Config{}, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/files" {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusConflict)
			zw := gzip.NewWriter(w)
			_, _ = zw.Write([]byte(`{"error":{"code":"invalid_state","message":"node: session is failed here"}}`))
			_ = zw.Close()
			return
		}
		var req agent.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		sawGzip.Store(r.Header.Get("Accept-Encoding") != "")
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = zw.Write([]byte(`{"error":{"status":403,"code":"policy_violation","message":"forged"}}` + "\n"))
		_ = zw.Close()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := n.Store.Heartbeat(ctx, store.NodeInfo{ID: "node_review", Addr: srv.URL, HeartbeatEvery: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c, err := nodeclient.New(n.Store, "tok").Agent(ctx, &session.Session{ID: id, NodeID: "node_review"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: 60}, nil)
	var ae *agent.Error
	if errors.As(err, &ae) && (ae.Status == http.StatusForbidden || ae.Code == "policy_violation") {
		t.Errorf("agent saw Accept-Encoding: %v; a gzipped forged line through the node: %v; want the node's 502 guest_error", sawGzip.Load(), err)
	}
	// The node's own answer, to a client that asks for gzip and reads the bytes as they come.
	req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/sessions/"+id+"/agent/v1/exec", strings.NewReader(`{"argv":["true"],"timeout_s":60}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var eb struct{ Error struct{ Code string } }
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || eb.Error.Code != "guest_error" || resp.Header.Get("Content-Encoding") != "" || sawGzip.Load() {
		t.Errorf("the node's answer to an agent's gzipped exec: %d %q, Content-Encoding %q, the agent saw Accept-Encoding: %v; want 502 guest_error, not encoded, and none asked of the agent",
			resp.StatusCode, eb.Error.Code, resp.Header.Get("Content-Encoding"), sawGzip.Load())
	}
	_, err = c.ReadFile(ctx, "f")
	if errors.As(err, &ae) && ae.Code == "invalid_state" {
		t.Errorf("a gzipped 409 invalid_state of the agent through the node: %v (status %d); want the node's 502 guest_error", err, ae.Status)
	}
}
