package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"wb/internal/fakenode"
)

// TestStalledExecReplaysIncomplete: an exec with an Idempotency-Key whose caller stopped
// reading (ended by WriteStall) replays as a 409 replay_incomplete, not as the bytes
// taken: those end mid-line, without a result or an error, and replayed as a 200 they read
// as a whole answer (as they did).
func TestStalledExecReplaysIncomplete(t *testing.T) {
	stopped := make(chan error, 1)
	e := newEnv(t, func(c *Config) {
		c.Guests = endlessExecNode{Node: c.Guests.(*fakenode.Node), stopped: stopped}
		c.WriteStall = 3 * time.Second
	})
	s := e.running(map[string]any{"tier": 2})
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	body := `{"command":"yes"}`
	fmt.Fprintf(conn, "POST /v1/sessions/%s/exec HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nAccept: application/x-ndjson\r\nIdempotency-Key: k1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		s.ID, e.key, len(body), body)
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		t.Fatalf("status line %q, %v", status, err)
	}
	select {
	case <-stopped:
	case <-time.After(45 * time.Second):
		t.Fatal("not stopped")
	}
	// The replay, once the first request recorded its answer.
	var got []byte
	var code int
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest("POST", e.url+"/v1/sessions/"+s.ID+"/exec", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Accept", "application/x-ndjson")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		code = resp.StatusCode
		if resp.Header.Get("Idempotent-Replayed") == "true" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code != 409 || !bytes.Contains(got, []byte(`"replay_incomplete"`)) {
		t.Errorf("the replay of a stalled exec: HTTP %d, %d bytes, beginning %.120q; want a 409 replay_incomplete", code, len(got), got)
	}
}
