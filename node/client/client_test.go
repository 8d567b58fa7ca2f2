package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestStopSavingOnAnOlderNode: a node from before StopSaving ignores save_as and answers its
// stop 204 with no body. The stop happened; nothing was saved. Before, the client failed to
// decode the empty answer, and a desktop's sleep during a rolling upgrade failed with it.
func TestStopSavingOnAnOlderNode(t *testing.T) {
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || !strings.HasSuffix(r.URL.Path, ":stop") {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, 400)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(node.Close)
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node_old", Addr: node.URL}); err != nil {
		t.Fatal(err)
	}
	reason := session.Deleted
	s := &session.Session{ID: session.NewID("sess_", time.Now()), ProjectID: "proj_a", NodeID: "node_old", StateReason: &reason}
	info, err := New(st, "").StopSaving(ctx, s, session.NewID("snap_", time.Now()))
	if err != nil || info != (hypervisor.SnapshotInfo{}) {
		t.Fatalf("stop saving on a node that answers 204: %+v, err %v; want nothing saved and no error", info, err)
	}
}

// TestTLSOnlyRefusesPlaintextNodes: a client that speaks to nodes over mutual TLS
// (WithDialTLS) refuses a node registered at an http:// URL off loopback, rather than send it
// the node token and the exec traffic in plaintext; an embedded node's on loopback is still
// reached. No packet leaves loopback: the test's dialer refuses any other address.
func TestTLSOnlyRefusesPlaintextNodes(t *testing.T) {
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(node.Close)
	var dialed []string
	var mu sync.Mutex
	loopbackOnly := func(c *Client, tr *http.Transport) {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialed = append(dialed, addr)
			mu.Unlock()
			if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
				return nil, fmt.Errorf("the test dials loopback only, not %s", addr)
			}
			return d.DialContext(ctx, network, addr)
		}
	}
	noTLS := func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no TLS node in this test")
	}
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	for id, addr := range map[string]string{"node_plain": "http://10.0.0.5:8081", "node_local": node.URL} {
		if err := st.Heartbeat(ctx, store.NodeInfo{ID: id, Addr: addr}); err != nil {
			t.Fatal(err)
		}
	}
	c := New(st, "node-token", loopbackOnly, WithDialTLS(noTLS))
	reason := session.Deleted
	stop := func(nodeID string) error {
		s := &session.Session{ID: session.NewID("sess_", time.Now()), ProjectID: "proj_a", NodeID: nodeID, StateReason: &reason}
		_, err := c.StopSaving(ctx, s, "")
		return err
	}
	if err := stop("node_plain"); err == nil || !strings.Contains(err.Error(), "--fleet-tls-*") {
		t.Errorf("a plaintext node off loopback: %v, want it refused naming --fleet-tls-*", err)
	}
	if err := stop("node_local"); err != nil {
		t.Errorf("a plaintext node on loopback (an embedded one): %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range dialed {
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("the client dialled %s", a)
		}
	}
}

// TestSnapshotRootImage: a node's snapshot answer reaches the gateway with the root disk image
// its memory restore needs; an earlier node's answer names none (any node restores it).
func TestSnapshotRootImage(t *testing.T) {
	var answer atomic.Value
	answer.Store(`{"memory":true,"size_bytes":4096,"root_image":"rootfs-1.ext4/uuid-a"}`)
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || !strings.HasSuffix(r.URL.Path, ":snapshot") {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, 400)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(answer.Load().(string)))
	}))
	t.Cleanup(node.Close)
	ctx := context.Background()
	st := store.New(redistest.Server(t))
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node_a", Addr: node.URL}); err != nil {
		t.Fatal(err)
	}
	s := &session.Session{ID: session.NewID("sess_", time.Now()), ProjectID: "proj_a", NodeID: "node_a"}
	info, err := New(st, "").Snapshot(ctx, s, session.NewID("snap_", time.Now()), true)
	if err != nil || !info.Memory || info.SizeBytes != 4096 || info.RootImage != "rootfs-1.ext4/uuid-a" {
		t.Fatalf("snapshot: %+v, %v", info, err)
	}
	answer.Store(`{"memory":true,"size_bytes":4096}`)
	info, err = New(st, "").Snapshot(ctx, s, session.NewID("snap_", time.Now()), true)
	if err != nil || !info.Memory || info.RootImage != "" {
		t.Fatalf("an earlier node's snapshot: %+v, %v", info, err)
	}
}
