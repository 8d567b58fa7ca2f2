package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"wb/agent"
	"wb/internal/fakenode"
	"wb/session"
)

// policyNode is a fake node whose agent proxy refuses every PTY, as a node does when the
// session's runtime policy kills or refuses the PTY's command.
type policyNode struct {
	*fakenode.Node
	refusing *httptest.Server
}

func (n policyNode) Agent(context.Context, *session.Session) (*agent.Client, error) {
	return agent.NewHTTPClient(http.DefaultClient, n.refusing.URL, ""), nil
}

// TestPTYRefusedByPolicy: a PTY whose command the runtime policy refuses answers 403
// policy_violation with the node's reason, not a 502 about a failed agent.
func TestPTYRefusedByPolicy(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":{"code":"policy_violation","message":"forbidden by policy rule crypto_miner; the session is stopped (policy_violation)"}}`))
	}))
	defer refusing.Close()
	e := newEnv(t, func(c *Config) {
		c.Guests = policyNode{Node: c.Guests.(*fakenode.Node), refusing: refusing}
	})
	s := e.running(map[string]any{"tier": 2})
	u := "ws" + strings.TrimPrefix(e.url, "http") + "/v1/sessions/" + s.ID + "/pty?command=xmrig"
	_, resp, err := websocket.Dial(context.Background(), u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + e.key}}})
	if err == nil || resp == nil {
		t.Fatalf("the PTY opened: %v", err)
	}
	defer resp.Body.Close()
	var body [2048]byte
	n, _ := resp.Body.Read(body[:])
	got := string(body[:n])
	if resp.StatusCode != 403 || !strings.Contains(got, `"policy_violation"`) || !strings.Contains(got, "crypto_miner") {
		t.Fatalf("refused PTY: HTTP %d %s; want 403 policy_violation naming the rule", resp.StatusCode, got)
	}
}
