package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"wb/agent"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// TestAgentRedirectIsNotFollowed: a node from before it refused its agents' redirects passes
// a guest's agent's 3xx on as it came. The client follows none: a redirect would resend the
// request, with the node token, to another session's agent on the node (its files, its exec,
// its PTY, which coder/websocket dials through the client's CheckRedirect) or fetch any other
// URL (the cloud's metadata, say). Each is an error, and no redirect's target is reached.
func TestAgentRedirectIsNotFollowed(t *testing.T) {
	var reached atomic.Int32
	meta := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = w.Write([]byte("internal-only answer"))
	}))
	t.Cleanup(meta.Close)
	var target atomic.Value
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/sessions/sess_attacker/") {
			http.Redirect(w, r, target.Load().(string), http.StatusTemporaryRedirect)
			return
		}
		reached.Add(1) // another session's agent
		if strings.HasSuffix(r.URL.Path, "/v1/pty") {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			_ = c.Write(r.Context(), websocket.MessageBinary, []byte("victim$ "))
			_ = c.Close(websocket.StatusNormalClosure, "")
			return
		}
		if strings.HasSuffix(r.URL.Path, "/v1/exec") {
			_, _ = w.Write([]byte(`{"exit_code":0}` + "\n"))
			return
		}
		_, _ = w.Write([]byte("victim's secret file"))
	}))
	t.Cleanup(node.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := store.New(redistest.Server(t))
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "node_old", Addr: node.URL}); err != nil {
		t.Fatal(err)
	}
	c, err := New(st, "tok").Agent(ctx, &session.Session{ID: "sess_attacker", NodeID: "node_old"})
	if err != nil {
		t.Fatal(err)
	}
	target.Store("/v1/sessions/sess_victim/agent/v1/files?path=/home/victim/.ssh/id_ed25519")
	if b, err := c.ReadFile(ctx, "f"); err == nil {
		t.Errorf("a file read its agent redirected to another session's: %q; want an error", b)
	}
	target.Store("/v1/sessions/sess_victim/agent/v1/exec")
	if res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: 60}, nil); err == nil {
		t.Errorf("an exec its agent redirected to another session's: %+v; want an error", res)
	}
	target.Store("/v1/sessions/sess_victim/agent/v1/pty")
	if ws, _, err := c.PTY(ctx, 80, 24, ""); err == nil {
		ws.CloseNow()
		t.Errorf("a PTY its agent redirected to another session's opened; want an error")
	}
	target.Store(meta.URL + "/latest/meta-data/")
	if b, err := c.ReadFile(ctx, "f"); err == nil {
		t.Errorf("a file read its agent redirected off the node: %q; want an error", b)
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the redirects' targets were reached %d times; want none", n)
	}
}
