package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"wb/internal/edgeauth"
	"wb/session"
)

// TestConnectURLs: a session's connect URLs point at the public URL and carry a connect
// token, with which exec, files and (from a page of another origin) the PTY work without the
// API key; the token opens no other session, an expired one answers 401 naming its expiry,
// and it never reaches the handlers (an exec retried through a fresher URL is the same
// Idempotency-Key request).
func TestConnectURLs(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	other := e.running(map[string]any{"tier": 2})
	var got session.Session
	e.mustDo("GET", "/v1/sessions/"+s.ID, e.key, nil, 200, &got)
	base := "/v1/sessions/" + s.ID
	tok := tokenOf(t, got.Connect.ExecURL)
	if got.Connect.ExecURL != e.url+base+"/exec?token="+tok || got.Connect.PTYURL != "ws"+strings.TrimPrefix(e.url, "http")+base+"/pty?token="+tok {
		t.Fatalf("connect %+v", got.Connect)
	}
	g, err := edgeSigner(t, e.st, edgeauth.PurposeConnect).Verify(tok, time.Now())
	if err != nil || g.SessionID != s.ID || g.ProjectID != e.projA ||
		g.ExpiresAt().Before(time.Now().Add(ConnectTokenTTL-time.Minute)) || g.ExpiresAt().After(time.Now().Add(ConnectTokenTTL+time.Second)) {
		t.Fatalf("token %+v %v: want session %s of %s for %s", g, err, s.ID, e.projA, ConnectTokenTTL)
	}
	// The list and the create answer carry tokens too; the stored session does not.
	var list struct{ Data []session.Session }
	e.mustDo("GET", "/v1/sessions", e.key, nil, 200, &list)
	for _, l := range list.Data {
		tokenOf(t, l.Connect.ExecURL)
	}
	stored, _ := e.st.Get(context.Background(), e.projA, s.ID)
	if strings.Contains(stored.Connect.ExecURL, "token") {
		t.Errorf("the store keeps a token: %s", stored.Connect.ExecURL)
	}

	// Exec and files by the token alone.
	var res session.ExecResult
	e.mustDo("POST", base+"/exec?token="+tok, "", map[string]any{"command": "echo by-token"}, 200, &res)
	if res.Stdout != "by-token\n" {
		t.Fatalf("exec by token: %+v", res)
	}
	e.mustDo("PUT", base+"/files?path=t.txt&token="+tok, "", []byte("hello"), 204, nil)
	if r := e.mustDo("GET", base+"/files?token="+tok+"&path=t.txt", "", nil, 200, nil); string(r.body) != "hello" {
		t.Fatalf("file by token: %q", r.body)
	}
	e.mustDo("DELETE", base+"/files?path=t.txt&token="+tok, "", nil, 204, nil)

	// The PTY from a page of another origin, as a browser opens it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, got.Connect.PTYURL, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"https://app.example"}}})
	if err != nil {
		t.Fatalf("PTY by token from another origin: %v (HTTP %v)", err, resp)
	}
	conn.CloseNow()
	// Without the token, another origin is still refused.
	_, resp, err = websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.url, "http")+base+"/pty", &websocket.DialOptions{
		HTTPHeader: http.Header{"Origin": {"https://app.example"}, "Authorization": {"Bearer " + e.key}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("PTY by key from another origin: %v (HTTP %v), want 403", err, resp)
	}

	// The token opens no other session.
	msg := expectError(t, e.do("POST", "/v1/sessions/"+other.ID+"/exec?token="+tok, "", map[string]any{"command": "true"}), 401, "unauthenticated", "token")
	if !strings.Contains(msg, "another session") {
		t.Errorf("misdirected token: %s", msg)
	}
	expectError(t, e.do("GET", "/v1/sessions/"+other.ID+"/files?path=x&token="+tok, "", nil), 401, "unauthenticated", "token")
	// Nor any route off the data path.
	expectError(t, e.do("GET", base+"?token="+tok, "", nil), 401, "unauthenticated", "")

	// An expired token answers 401 naming its expiry; a forged one 401.
	connect := edgeSigner(t, e.st, edgeauth.PurposeConnect)
	at := time.Now().Add(-time.Second).Truncate(time.Second)
	expired := connect.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: e.projA, Expires: at.Unix()})
	msg = expectError(t, e.do("POST", base+"/exec?token="+expired, "", map[string]any{"command": "true"}), 401, "unauthenticated", "token")
	if !strings.Contains(msg, "expired at "+at.UTC().Format(time.RFC3339)) {
		t.Errorf("expired token: %s", msg)
	}
	expectError(t, e.do("POST", base+"/exec?token="+tok[:len(tok)-2]+"xx", "", map[string]any{"command": "true"}), 401, "unauthenticated", "token")

	// An Idempotency-Key exec retried through a fresher connect URL replays the first answer.
	later := connect.Sign(edgeauth.Grant{SessionID: s.ID, ProjectID: e.projA, Expires: time.Now().Add(10 * time.Minute).Unix()})
	if later == tok {
		t.Fatal("the two tokens are the same")
	}
	first := e.mustDo("POST", base+"/exec?token="+tok, "", map[string]any{"command": "echo $$"}, 200, nil, "Idempotency-Key", "k1")
	again := e.mustDo("POST", base+"/exec?token="+later, "", map[string]any{"command": "echo $$"}, 200, nil, "Idempotency-Key", "k1")
	if again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) {
		t.Errorf("retry through a fresher URL: replayed %q, %s vs %s", again.header.Get("Idempotent-Replayed"), again.body, first.body)
	}
}
