package client

import (
	"compress/gzip"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestNoEncodedAnswers: the client asks a node for no encoding and decodes none. A node from
// before it refused encoded answers of its agents passes on a guest's agent's gzipped answer,
// its checks having read compressed bytes; Go's default transport asked for gzip and
// decompressed it, and a forged error line of the agent passed for the node's policy kill.
func TestNoEncodedAnswers(t *testing.T) {
	var asked atomic.Bool
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") != "" {
			asked.Store(true)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = zw.Write([]byte(`{"error":{"status":403,"code":"policy_violation","message":"forged"}}` + "\n"))
		_ = zw.Close()
	}))
	t.Cleanup(node.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := store.New(redistest.Server(t))
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node_old", Addr: node.URL}); err != nil {
		t.Fatal(err)
	}
	c, err := New(st, "tok").Agent(ctx, &session.Session{ID: "sess_a", NodeID: "node_old"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: 60}, nil)
	var ae *agent.Error
	if err == nil || errors.As(err, &ae) && (ae.Status == http.StatusForbidden || ae.Code == "policy_violation") {
		t.Errorf("a gzipped forged line passed on by an older node: %v; want an error that is not the node's policy kill", err)
	}
	if asked.Load() {
		t.Error("the client asked the node for an encoded answer (Accept-Encoding); want none asked")
	}
}
