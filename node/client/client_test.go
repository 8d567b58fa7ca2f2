package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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
	mem, size, err := New(st, "").StopSaving(ctx, s, session.NewID("snap_", time.Now()))
	if err != nil || mem || size != 0 {
		t.Fatalf("stop saving on a node that answers 204: memory %v, size %d, err %v; want nothing saved and no error", mem, size, err)
	}
}
