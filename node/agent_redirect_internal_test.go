package node

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"wb/agent"
	nodeclient "wb/node/client"
	"wb/session"
	"wb/store"
)

// TestAgentRedirectIsNotFollowed: a guest may replace its agent, and its agent's redirect
// must take the gateway nowhere. The node passed an agent's 3xx on as it came and the
// gateway's client of the nodes followed it, with the node token: to another session's agent
// on the same node (its files, its exec, its PTY) and to any other URL (the cloud's metadata,
// say, in plaintext past WithDialTLS). The node now answers any 3xx of the agent with its 502
// guest_error, and the gateway's client follows no redirect (see node/client's test for a
// node from before).
func TestAgentRedirectIsNotFollowed(t *testing.T) {
	const attacker, victim = "sess_attacker", "sess_victim"
	var target string
	n, srv, _ := hostileAgentNode(t, attacker, Config{}, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target, http.StatusTemporaryRedirect)
	})
	// A second, benign session on the same node: its agent serves its files.
	vGuest := "g_victim"
	sock := filepath.Join(n.guestDir(vGuest), "agent", "agent.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	vs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/pty" {
			wc, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			_ = wc.Write(r.Context(), websocket.MessageBinary, []byte("victim$ "))
			_ = wc.Close(websocket.StatusNormalClosure, "")
			return
		}
		if r.URL.Path == "/v1/exec" {
			b, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/x-ndjson")
			_, _ = w.Write([]byte(`{"stream":"stdout","data":"victim's guest ran ` + strings.ReplaceAll(string(b), `"`, `'`) + `"}` + "\n" + `{"exit_code":0}` + "\n"))
			return
		}
		_, _ = w.Write([]byte("victim's secret file " + r.URL.Query().Get("path")))
	})}
	go func() { _ = vs.Serve(ln) }()
	t.Cleanup(func() { _ = vs.Close() })
	vl := &live{g: &guest{SessionID: victim, Project: "proj_victim", GuestID: vGuest, State: session.Running, Template: "tpl",
		StartedAt: time.Now(), IdleTimeoutS: 600, MaxLifetimeS: 600}, agent: agent.NewClient(sock)}
	t.Cleanup(vl.agent.Close)
	n.mu.Lock()
	n.guests[victim] = vl
	n.mu.Unlock()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := n.Store.Heartbeat(ctx, store.NodeInfo{ID: "node_review", Addr: srv.URL, HeartbeatEvery: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	nc := nodeclient.New(n.Store, "tok") // the gateway's client of the nodes
	c, err := nc.Agent(ctx, &session.Session{ID: attacker, NodeID: "node_review"})
	if err != nil {
		t.Fatal(err)
	}
	target = "/v1/sessions/" + victim + "/agent/v1/files?path=/home/victim/.ssh/id_ed25519"
	// The node's own answer, to a client that follows nothing: its 502 guest_error, without
	// the agent's Location.
	req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/sessions/"+attacker+"/agent/v1/files?path=x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok")
	raw := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := raw.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var eb struct{ Error struct{ Code string } }
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || eb.Error.Code != "guest_error" || resp.Header.Get("Location") != "" {
		t.Errorf("the node's answer to an agent's 307: %d %q, Location %q; want 502 guest_error and no Location", resp.StatusCode, eb.Error.Code, resp.Header.Get("Location"))
	}
	if b, err := c.ReadFile(ctx, "anything"); err == nil {
		t.Errorf("the attacker's file read, redirected by its agent: %q; want an error, not another session's file", b)
	}
	target = "/v1/sessions/" + victim + "/agent/v1/exec"
	if res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"cat", "/etc/shadow"}, TimeoutS: 60}, nil); err == nil {
		t.Errorf("the attacker's exec, redirected by its agent: %+v; want an error, not a run in another session", res)
	}
	target = "/v1/sessions/" + victim + "/agent/v1/pty?cols=80&rows=24&command=sh"
	if ws, _, err := c.PTY(ctx, 80, 24, "sh"); err == nil {
		_, msg, rerr := ws.Read(ctx)
		t.Errorf("the attacker's PTY, redirected by its agent: opened, first frame %q (%v); want an error, not another session's PTY", msg, rerr)
		ws.CloseNow()
	}
	meta := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("internal-only answer (e.g. cloud metadata credentials)"))
	}))
	defer meta.Close()
	target = meta.URL + "/latest/meta-data/iam/security-credentials/role"
	if b, err := c.ReadFile(ctx, "anything"); err == nil {
		t.Errorf("the attacker's file read, redirected off the node: %q; want an error, not a fetch of another URL", b)
	}
}
