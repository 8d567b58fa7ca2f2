package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/internal/redistest"
	"wb/internal/syncbuf"
	"wb/session"
	"wb/store"
)

// hostileAgentNode is a node whose one running session, id, has for its guest's agent the
// handler agentH (a guest may replace its agent with anything), and the node's API served on
// a loopback server; cfg's exec fields, its driver (if any) and its metrics carry over. logs holds the node's log.
func hostileAgentNode(t *testing.T, id string, cfg Config, agentH http.HandlerFunc) (n *Node, srv *httptest.Server, logs *syncbuf.Buffer) {
	t.Helper()
	dir, err := os.MkdirTemp("", "wbx") // t.TempDir's is too long for the guests' sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	logs = &syncbuf.Buffer{}
	var driver hypervisor.Driver = countersOnly{}
	if cfg.Driver != nil {
		driver = cfg.Driver
	}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	if cfg.Logger != nil { // the caller's, whose log it reads itself
		logger = cfg.Logger
	}
	n, err = New(Config{Store: store.New(redistest.Server(t)), Driver: driver, Templates: templates.Catalog{"tpl": {}},
		DataDir: dir, Logger: logger, WriteStall: cfg.WriteStall, ExecDrain: cfg.ExecDrain, Metrics: cfg.Metrics})
	if err != nil {
		t.Fatal(err)
	}
	close(n.recovered)
	t.Cleanup(n.cancel)
	n.execGrace = 300 * time.Millisecond
	guestID := "g_" + strings.TrimPrefix(id, "sess_")
	sock := filepath.Join(n.guestDir(guestID), "agent", "agent.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/health" { // the node asks it when an exec broke
			_, _ = w.Write([]byte(`{"ok":true,"pid":1}`))
			return
		}
		agentH(w, r)
	})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	l := &live{g: &guest{SessionID: id, Project: "proj_hostile", GuestID: guestID, State: session.Running, Template: "tpl",
		StartedAt: time.Now(), IdleTimeoutS: 600, MaxLifetimeS: 600}, agent: agent.NewClient(sock)}
	t.Cleanup(l.agent.Close)
	n.guests[id] = l
	srv = httptest.NewServer(n.Handler("tok"))
	t.Cleanup(srv.Close)
	return n, srv, logs
}

// endlessOutput is an agent that answers every exec with output lines of data, every, without
// end, and sends on closed once the node closed its connection (the agent kills the command's
// processes then).
func endlessOutput(data string, every time.Duration, closed chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req agent.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/x-ndjson")
		line := []byte(`{"stream":"stdout","data":"` + data + `"}` + "\n")
		for {
			if every > 0 {
				select {
				case <-r.Context().Done():
					closed <- struct{}{}
					return
				case <-time.After(every):
				}
			}
			if _, err := w.Write(line); err != nil {
				closed <- struct{}{}
				return
			}
			if err := http.NewResponseController(w).Flush(); err != nil {
				closed <- struct{}{}
				return
			}
		}
	}
}

// TestExecStalledCallerEndsTheExec: a caller of the node's API that stays connected but takes
// no more of an exec's answer ends the exec once a write waited WriteStall: the node
// closes its connection to the agent (which kills the command's processes, as its timeout
// does) and logs it. Before, the exec, the proxy and the command were held for as long as the
// caller stayed.
func TestExecStalledCallerEndsTheExec(t *testing.T) {
	closed := make(chan struct{}, 4)
	const id = "sess_stalledcaller"
	_, srv, logs := hostileAgentNode(t, id, Config{WriteStall: time.Second}, endlessOutput(strings.Repeat("x", 16<<10), 0, closed))

	body := `{"argv":["yes"],"timeout_s":3600}`
	nodeCall(t, srv.Listener.Addr().String(), true, fmt.Sprintf("POST /v1/sessions/%s/agent/v1/exec HTTP/1.1\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", id, len(body), body), " 200 ")
	// The caller now reads no more, and stays.
	waitCutOff(t, closed, logs, "took none of the exec's answer", "the exec")
}

// TestExecAnswerWithoutEndIsCut: an agent whose answer has no end, read by a caller as slowly
// as it comes (the backstop counts the agent's time only, and it uses almost none), is ended
// ExecDrain past the exec's timeout and the grace, in process (Node.Exec) and through the
// node's API, with the backstop's error; the node closes the agent's connection. Before, the
// exec went on for as long as its caller read.
func TestExecAnswerWithoutEndIsCut(t *testing.T) {
	closed := make(chan struct{}, 4)
	const id = "sess_endless"
	n, srv, _ := hostileAgentNode(t, id, Config{ExecDrain: time.Second}, endlessOutput("more", 0, closed))
	// slow takes each line 5 ms after it came: it reads, always; once fast, at once.
	var fast atomic.Bool
	slow := func(session.ExecChunk) error {
		if !fast.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		return nil
	}
	timeout := 1
	wantBackstop := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), errExecUnanswered.Error()) {
			t.Errorf("%s: %v; want the backstop's error", what, err)
		}
	}
	agentClosed := func(what string, start time.Time) {
		t.Helper()
		select {
		case <-closed:
		case <-time.After(30*time.Second - time.Since(start)):
			t.Errorf("%s: the node's request to the agent was still open after 30 s; want it closed about its 1 s timeout, the 300 ms grace and the 1 s ExecDrain on", what)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	start := time.Now()
	_, err := n.Exec(ctx, &session.Session{ID: id}, session.ExecRequest{Command: json.RawMessage(`"yes"`), TimeoutS: &timeout}, nil, slow)
	wantBackstop("Node.Exec", err)
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("Node.Exec: ended after %s; want about its 1 s timeout, the 300 ms grace and the 1 s ExecDrain", took)
	}
	agentClosed("Node.Exec", start)

	// Through the node's API, what the node sent before the end waits in the sockets' buffers
	// for the slow caller: the node ends the exec on time, and the caller that reads on gets
	// the backstop's error last.
	ctx, cancel = context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	done := make(chan error, 1)
	start = time.Now()
	go func() {
		_, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"yes"}, TimeoutS: timeout}, slow)
		done <- err
	}()
	agentClosed("through the node's API", start)
	fast.Store(true)
	err = <-done
	wantBackstop("through the node's API", err)
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway {
		t.Errorf("through the node's API: %v; want a 502 from the node", err)
	}
}

// forgedLines are lines a hostile agent may send in an exec's answer shaped as the node's own
// error record (agent.BrokenLine), each spelled as a JSON decoder reads it.
var forgedLines = []string{
	`{"error":{"status":403,"code":"policy_violation","message":"forbidden by policy rule forged; the session is stopped (policy_violation)"}}`,
	`{"ERROR":{"status":403,"code":"policy_violation","message":"forbidden by policy rule forged"}}`,
	`{"\u0065rror":{"status":403,"code":"policy_violation","message":"forbidden by policy rule forged"}}`,
	`{"stream":"stdout","data":"x","error":{"status":409,"code":"invalid_state","message":"node: session is failed here"}}`,
}

// TestExecForgedErrorLine: an agent that sends, in an exec's answer, a line shaped as the
// node's own error record does not pass it for the node's: through the node's API the node
// ends the answer with its own error, a 502 naming the guest, and in process (Node.Exec) the
// line is refused as the agent's; either way the exec ends and its agent's connection closes.
// Before, the node passed the line on, and its caller took it for the node's refusal (a 403
// policy_violation, a 409 invalid_state).
func TestExecForgedErrorLine(t *testing.T) {
	closed := make(chan struct{}, 4)
	var forged atomic.Int64
	const id = "sess_forged"
	n, srv, _ := hostileAgentNode(t, id, Config{}, func(w http.ResponseWriter, r *http.Request) {
		var req agent.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(`{"stream":"stdout","data":"hi\n"}` + "\n" + forgedLines[forged.Load()] + "\n"))
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
			closed <- struct{}{}
		case <-time.After(time.Minute):
		}
	})
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	timeout := 600
	for i, line := range forgedLines {
		forged.Store(int64(i))
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		var got string
		_, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: timeout}, func(ch session.ExecChunk) error {
			got += ch.Data
			return nil
		})
		var ae *agent.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || ae.Code != "guest_error" {
			t.Errorf("through the node's API, the agent sending %s: %v; want the node's 502 guest_error", line, err)
		}
		if got != "hi\n" {
			t.Errorf("through the node's API: output %q; want the agent's line before the forged one", got)
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Errorf("through the node's API, the agent sending %s: the agent's connection stayed open", line)
		}

		_, err = n.Exec(ctx, &session.Session{ID: id}, session.ExecRequest{Command: json.RawMessage(`"true"`), TimeoutS: &timeout}, nil, func(session.ExecChunk) error { return nil })
		if err == nil || errors.As(err, &ae) && (ae.Status == http.StatusForbidden || ae.Code == "policy_violation" || ae.Code == "invalid_state") {
			t.Errorf("Node.Exec, the agent sending %s: %v; want an error of the guest's, not a refusal of the node's", line, err)
		}
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Errorf("Node.Exec, the agent sending %s: the agent's connection stayed open", line)
		}
		cancel()
	}
}

// TestExecForgedLineAfterSizedAnswer: the node's own 502 guest_error line, which ends an
// exec's answer whose agent sent a line shaped as the node's error record, reaches the
// caller when the agent's answer had a Content-Length (as net/http gives any short answer
// whose handler returned: the agent's own, for a command without output). Before, the proxy
// passed that length on for the node's different body, and the caller read no line at all
// (unexpected EOF).
func TestExecForgedLineAfterSizedAnswer(t *testing.T) {
	const id = "sess_sizedforged"
	_, srv, _ := hostileAgentNode(t, id, Config{}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(forgedLines[0] + "\n"))
	})
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	_, err := c.Exec(t.Context(), agent.ExecRequest{Argv: []string{"true"}, TimeoutS: 60}, func(session.ExecChunk) error { return nil })
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || ae.Code != "guest_error" {
		t.Fatalf("an agent's sized answer with a forged line, through the node: %v; want the node's 502 guest_error", err)
	}
}

// TestAgentRefusalIsNotTheNodes: an agent's error answer that could pass for the node's own
// refusal (a 403, which callers take for the runtime policy's kill; a code the node alone
// answers, invalid_state) reaches the node's callers as the guest's error, a 502 guest_error,
// for an exec, a file and a PTY, through the node's API and in process (Node.Exec,
// Local.Agent); an agent's other errors (a file not found) pass as they are. Before, the
// node passed each on as it came, and a hostile guest's sessions looked policy-killed.
func TestAgentRefusalIsNotTheNodes(t *testing.T) {
	var answer atomic.Pointer[string]
	const id = "sess_refusing"
	n, srv, _ := hostileAgentNode(t, id, Config{}, func(w http.ResponseWriter, r *http.Request) {
		status, body, _ := strings.Cut(*answer.Load(), " ")
		w.Header().Set("Content-Type", "application/json")
		code := 403
		fmt.Sscan(status, &code)
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	})
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	local, err := n.Local().Agent(t.Context(), &session.Session{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	timeout := 60
	calls := map[string]func() error{
		"exec through the node's API": func() error {
			_, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: timeout}, nil)
			return err
		},
		"a file through the node's API": func() error {
			_, err := c.ReadFile(ctx, "f")
			return err
		},
		"a PTY through the node's API": func() error {
			_, _, err := c.PTY(ctx, 80, 24, "sh")
			return err
		},
		"Node.Exec": func() error {
			_, err := n.Exec(ctx, &session.Session{ID: id}, session.ExecRequest{Command: json.RawMessage(`"true"`), TimeoutS: &timeout}, nil, nil)
			return err
		},
		"a PTY in process": func() error {
			_, _, err := local.PTY(ctx, 80, 24, "sh")
			return err
		},
	}
	for _, forged := range []string{
		`403 {"error":{"code":"policy_violation","message":"forbidden by policy rule forged; the session is stopped (policy_violation)","param":"forged"}}`,
		`403 {"error":{"code":"forbidden","message":"f: permission denied"}}`,
		`403 not json`,
		`409 {"error":{"code":"invalid_state","message":"node: session is failed here"}}`,
	} {
		answer.Store(&forged)
		for what, call := range calls {
			err := call()
			var ae *agent.Error
			if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || ae.Code != "guest_error" {
				t.Errorf("%s, the agent answering %s: %v; want the node's 502 guest_error", what, forged, err)
			}
		}
	}
	notFound := `404 {"error":{"code":"not_found","message":"f does not exist","param":"path"}}`
	answer.Store(&notFound)
	_, err = c.ReadFile(ctx, "f")
	if ae := (*agent.Error)(nil); !errors.As(err, &ae) || ae.Status != http.StatusNotFound || ae.Code != "not_found" {
		t.Errorf("a file the agent does not find, through the node's API: %v; want the agent's 404 as it came", err)
	}
}

// TestForgedErrorLineUnder2xx: the node checked the lines of an exec's answer only when it was
// a 200, and the agent's client took any 2xx for one: a hostile agent answering 201 passed a
// forged error line on as the node's policy kill. The node now answers an exec's answer of
// any status but 200 (below 400) with its 502 guest_error, and the client reads none.
func TestForgedErrorLineUnder2xx(t *testing.T) {
	const id = "sess_forged201"
	_, srv, _ := hostileAgentNode(t, id, Config{}, func(w http.ResponseWriter, r *http.Request) {
		var req agent.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"error":{"status":403,"code":"policy_violation","message":"forged"}}` + "\n"))
	})
	c := agent.NewHTTPClient(srv.Client(), srv.URL+"/v1/sessions/"+id+"/agent", "tok")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"true"}, TimeoutS: 60}, nil)
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusBadGateway || ae.Code != "guest_error" {
		t.Errorf("an agent answering 201 with a forged line: %v; want the node's 502 guest_error", err)
	}
	// The node's own answer, for a client that takes any 2xx for success.
	req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/sessions/"+id+"/agent/v1/exec", strings.NewReader(`{"argv":["true"],"timeout_s":60}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("the node's answer to an agent's 201 exec: %d; want 502", resp.StatusCode)
	}
}

// oomDriver is a driver whose guests count kills OOM kills, and whose stop and delete do
// nothing (the guest is a hostile agent's server, which the test ends).
type oomDriver struct {
	countersOnly
	kills *atomic.Int64
}

func (d oomDriver) OOMKills(context.Context, string) (int64, error) { return d.kills.Load(), nil }
func (oomDriver) Stop(context.Context, string) error                { return nil }
func (oomDriver) Delete(context.Context, string) error              { return nil }
func (oomDriver) Name() string                                      { return "oomtest" }

// TestOOMCheckBeforeAnyResultSpelling: the node fails a session whose guest counts an OOM
// kill during an exec before the exec's result line goes out through its API, however the
// agent spells the result's key (as the agent's client reads it: any spelling a JSON decoder
// takes for "exit_code"), and an output line that quotes the key does not set the check off.
// Before, the node looked for the bytes "exit_code", and a hostile agent that spelled it
// "exit\u005fcode" or "EXIT_CODE" had its result read by the caller while the session still
// ran, failed only once the answer ended.
func TestOOMCheckBeforeAnyResultSpelling(t *testing.T) {
	for i, key := range []string{`"exit_code"`, `"exit\u005fcode"`, `"EXIT_CODE"`, `"Exit_Code"`, `"\u0065xit_cod\u0065"`} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			kills := &atomic.Int64{}
			next := make(chan struct{})
			id := fmt.Sprintf("sess_oomspelling%d", i)
			n, srv, _ := hostileAgentNode(t, id, Config{Driver: oomDriver{kills: kills}}, func(w http.ResponseWriter, r *http.Request) {
				var req agent.ExecRequest
				_ = json.NewDecoder(r.Body).Decode(&req)
				w.Header().Set("Content-Type", "application/x-ndjson")
				_, _ = w.Write([]byte(`{"stream":"stdout","data":"a guest may print \"exit_code\": 0 and ` + strings.ReplaceAll(key, `"`, `\"`) + `\n"}` + "\n"))
				_ = http.NewResponseController(w).Flush()
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
				kills.Add(1) // the OOM killer took the command
				_, _ = w.Write([]byte(`{` + key + `:137,"duration_ms":12}` + "\n"))
				_ = http.NewResponseController(w).Flush()
				// The answer stays open: the node's check must not wait for its end.
				select {
				case <-r.Context().Done():
				case <-time.After(time.Minute):
				}
			})
			n.mu.Lock()
			l := n.guests[id]
			n.mu.Unlock()
			state := func() (session.State, session.Reason) {
				l.mu.Lock()
				defer l.mu.Unlock()
				return l.g.State, l.g.Reason
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/sessions/"+id+"/agent/v1/exec", strings.NewReader(`{"argv":["hog"],"timeout_s":60}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer tok")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			lines := bufio.NewReader(resp.Body)
			out, err := lines.ReadString('\n')
			if err != nil {
				t.Fatalf("the exec's output line: %q, %v", out, err)
			}
			if st, _ := state(); st != session.Running {
				t.Errorf("after an output line that quotes the key, the session is %s; want it running", st)
			}
			close(next)
			res, err := lines.ReadString('\n')
			if err != nil {
				t.Fatalf("the exec's result line: %q, %v", res, err)
			}
			if st, reason := state(); st == session.Running || reason != session.OOM {
				t.Errorf("the agent's result line %s came out with the session %s (reason %q); want it failed with oom before", strings.TrimSpace(res), st, reason)
			}
		})
	}
}

// TestAgentPathIsCanonical: the node passes on to a guest's agent its canonical paths alone:
// an exec sent on another spelling of /v1/exec (a trailing slash, a doubled or dotted
// segment, a percent-encoded byte) is refused with a 400, and none reaches the agent, while
// an exec with a query gets the node's checks as any exec does (the agent's 201 is refused).
// Before, the node applied its exec checks to the decoded path /v1/exec alone, passed the
// other spellings on as they came or redirected them, and had the agent decide what they
// were.
func TestAgentPathIsCanonical(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	const id = "sess_paths"
	_, srv, _ := hostileAgentNode(t, id, Config{}, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RequestURI())
		mu.Unlock()
		// An agent that takes anything for an exec, and answers it so that only the node's
		// checks tell it from the node's refusal.
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"error":{"status":403,"code":"policy_violation","message":"forged"}}` + "\n"))
	})
	base := srv.URL + "/v1/sessions/" + id + "/agent"
	post := func(path string) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "POST", base+path, strings.NewReader(`{"argv":["true"],"timeout_s":60}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultTransport.RoundTrip(req) // no redirect followed
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/v1/exec/", "//v1/exec", "/v1/./exec", "/v1//exec", "/v1/%65xec", "/v1%2Fexec", "/v1/exec/%2e%2e/exec",
		"/v1/x/../exec", "/./v1/exec", "/v1/%2e/exec", "/v1/exec%2F", "/v1/exec%3Fx=1"} {
		if got := post(path); got != http.StatusBadRequest {
			t.Errorf("an exec on %s: %d; want the node's 400", path, got)
		}
	}
	mu.Lock()
	if len(seen) > 0 {
		t.Errorf("the agent was sent %q; want none of the other spellings of /v1/exec", seen)
	}
	mu.Unlock()
	for _, path := range []string{"/v1/exec", "/v1/exec?x=1"} {
		if got := post(path); got != http.StatusBadGateway {
			t.Errorf("an exec on %s, the agent answering 201: %d; want the node's 502 guest_error (its checks)", path, got)
		}
	}
}

// endlessFile is an agent that answers every file read with bytes without end, and sends on
// closed once the node closed its connection.
func endlessFile(closed chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		piece := make([]byte, 64<<10)
		for {
			if _, err := w.Write(piece); err != nil {
				closed <- struct{}{}
				return
			}
		}
	}
}

// TestFileReadStalledCallerIsCut: a caller of the node's API that stays connected but takes
// no more of a file's read ends the read once a write waited WriteStall: the node closes its
// connection to the agent and logs it. Before, the read, the proxy and the agent's connection
// were held for as long as the caller stayed.
func TestFileReadStalledCallerIsCut(t *testing.T) {
	closed := make(chan struct{}, 4)
	const id = "sess_stalledreader"
	_, srv, logs := hostileAgentNode(t, id, Config{WriteStall: time.Second}, endlessFile(closed))

	nodeCall(t, srv.Listener.Addr().String(), true, "GET /v1/sessions/"+id+"/agent/v1/files?path=big HTTP/1.1\r\n\r\n", " 200 ")
	// The caller now reads no more, and stays.
	waitCutOff(t, closed, logs, "took none of the answer", "the file's read")
}

// waitCutOff waits for the node to close its connection to the agent (closed) once what's
// caller stopped reading, and for its log to say so (line).
func waitCutOff(t *testing.T, closed <-chan struct{}, logs *syncbuf.Buffer, line, what string) {
	t.Helper()
	select {
	case <-closed:
	case <-time.After(45 * time.Second):
		t.Fatalf("45 s after its caller stopped reading, %s still held the agent's connection; want it ended after the 1 s WriteStall", what)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), line); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the node's log does not say that %s's caller stalled (%q):\n%s", what, line, logs.String())
		}
	}
}

// endlessPTY is an agent that upgrades every PTY and sends its output without end, and sends
// on closed once the node closed its connection (the agent kills the PTY's program then).
func endlessPTY(closed chan<- struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		if brw.Flush() != nil {
			closed <- struct{}{}
			return
		}
		piece := make([]byte, 64<<10)
		for {
			if _, err := c.Write(piece); err != nil {
				closed <- struct{}{}
				return
			}
		}
	}
}

// TestPTYStalledCallerIsCut: a caller of the node's API whose PTY's output it stays connected
// for but takes no more of ends the PTY once a write waited WriteStall: the node closes its
// connection to the agent (which kills the PTY's program) and its caller's, and logs it.
// Before, the node's copy of the agent's output to the caller blocked for as long as the
// caller stayed, holding the proxy's goroutines, both connections and the program.
func TestPTYStalledCallerIsCut(t *testing.T) {
	closed := make(chan struct{}, 4)
	const id = "sess_stalledpty"
	_, srv, logs := hostileAgentNode(t, id, Config{WriteStall: time.Second}, endlessPTY(closed))

	conn := nodeCall(t, srv.Listener.Addr().String(), true, ptyRequest(id), " 101 ")
	// The caller now reads no more, and stays.
	waitCutOff(t, closed, logs, "took none of the PTY's output", "the node's PTY copy")
	// The caller's connection is closed too: the node answers the caller's bytes with a
	// reset (its end, past the output the caller has not read, may wait on TCP's backed-off
	// window probes for long).
	deadline := time.Now().Add(30 * time.Second)
	buf := make([]byte, 64<<10)
	for {
		if time.Now().After(deadline) {
			t.Fatal("30 s after the PTY ended, its caller's connection to the node was still open; want it closed")
		}
		_, werr := conn.Write([]byte("x"))
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, rerr := conn.Read(buf)
		if werr != nil || (rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded)) {
			break
		}
	}
}

// nodeCall sends request (its request line, then the lines after the headers: the node's
// Host and token are put between them) to the node at addr on a connection of its own, small
// in what it reads ahead when small, and answers the connection once the answer's status
// line has status; the test closes it.
func nodeCall(t *testing.T, addr string, small bool, request, status string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if tc, ok := conn.(*net.TCPConn); ok && small {
		_ = tc.SetReadBuffer(4 << 10)
	}
	line, rest, _ := strings.Cut(request, "\r\n")
	fmt.Fprintf(conn, "%s\r\nHost: node\r\nAuthorization: Bearer tok\r\n%s", line, rest)
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(got, status) {
		t.Fatalf("the answer's status line: %q, %v; want%s", got, err, status)
	}
	return conn
}

// ptyRequest is a PTY's WebSocket upgrade of session id, as nodeCall sends it.
func ptyRequest(id string) string {
	return "GET /v1/sessions/" + id + "/agent/v1/pty?cols=80&rows=24 HTTP/1.1\r\n" +
		"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
}

// deafPTY is an agent that upgrades every PTY, then takes none of its input and sends
// nothing, holding the connection until the test ends.
func deafPTY(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		<-t.Context().Done()
	}
}

// TestPTYDeafAgentIsCut: a PTY whose guest's agent takes none of its input (and sends
// nothing) ends once the node's write of the input to it waited WriteStall: the node closes
// its caller's connection. Before, the node's copy of the input blocked on the agent for as
// long as the guest ran, and read its caller no more: a caller that gave up and left (the
// gateway does, after its own bound) was not seen, and the proxy's goroutines and both
// connections stayed held, one set for each such PTY.
func TestPTYDeafAgentIsCut(t *testing.T) {
	const id = "sess_deafpty"
	_, srv, _ := hostileAgentNode(t, id, Config{WriteStall: time.Second}, deafPTY(t))

	conn := nodeCall(t, srv.Listener.Addr().String(), false, ptyRequest(id), " 101 ")
	// The caller types without end; its writes fail once the node closed the connection.
	written := make(chan error, 1)
	go func() {
		piece := make([]byte, 64<<10)
		for {
			if _, err := conn.Write(piece); err != nil {
				written <- err
				return
			}
		}
	}()
	select {
	case <-written:
	case <-time.After(45 * time.Second):
		t.Fatal("45 s after the guest's agent stopped taking the PTY's input, the node still held its caller's connection; want it closed after the 1 s WriteStall")
	}
}
