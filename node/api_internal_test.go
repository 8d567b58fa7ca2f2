package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"wb/agent"
	"wb/hypervisor"
	"wb/node/nodeapi"
	"wb/session"
)

// TestExplainedExecChecksBeforeResult: an exec's answer read through explainedExec runs its
// check once, before any byte of the result line is read, however small the reads and however
// the result's key is spelled (as the agent's client decodes it); an output line that quotes
// the key (escaped, as a JSON string must) does not set it off, nor does an answer without a
// result.
func TestExplainedExecChecksBeforeResult(t *testing.T) {
	out := `{"stream":"stdout","data":"a guest may print \"exit_code\": 0"}` + "\n"
	whyBroke := func(_ context.Context, err error) error { return err }
	for _, key := range []string{`"exit_code"`, `"exit\u005fcode"`, `"EXIT_CODE"`} {
		answer := out + `{` + key + `:137,"duration_ms":12}` + "\n"
		for size := 1; size <= len(answer); size++ {
			calls, at := 0, -1
			var got []byte
			check := &resultCheck{check: func() { calls++; at = len(got) }}
			e := newExplainedExec(context.Background(), io.NopCloser(strings.NewReader(answer)), whyBroke, nil, check)
			p := make([]byte, size)
			for {
				n, err := e.Read(p)
				got = append(got, p[:n]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if calls != 1 || at != len(out) {
				t.Fatalf("key %s, reads of %d bytes: %d checks, the last after %d bytes; want one, after the output line's %d", key, size, calls, at, len(out))
			}
			if string(got) != answer {
				t.Fatalf("the answer changed: %q", got)
			}
		}
	}
	calls := 0
	check := &resultCheck{check: func() { calls++ }}
	e := newExplainedExec(context.Background(), io.NopCloser(strings.NewReader(strings.Repeat(out, 3))), whyBroke, nil, check)
	if got, err := io.ReadAll(e); err != nil || string(got) != strings.Repeat(out, 3) {
		t.Fatalf("an answer without a result: %q, %v", got, err)
	}
	if calls != 0 {
		t.Fatal("an output line that quotes the key set the check off")
	}
}

// TestAgentProxyExplainsABrokenExec: an exec's answer that breaks off after whole lines ends,
// through the node's proxy, with the refusal whyBroke names (the guest's end), which the
// agent's client answers as an *agent.Error of its status and code, after the output that
// came (an answer broken mid-line drops the line's start, so that the refusal starts its
// own line); an answer whose guest lives stays broken.
func TestAgentProxyExplainsABrokenExec(t *testing.T) {
	cases := []struct {
		name, sent    string
		beforeHeaders bool // the agent sends its status with the first output or the result
		alive         bool
		wantRefusal   bool
	}{
		{name: "after a line", sent: `{"stream":"stdout","data":"x"}` + "\n", wantRefusal: true},
		{name: "before any line", sent: "", wantRefusal: true},
		{name: "before its status", beforeHeaders: true, wantRefusal: true},
		{name: "mid-line", sent: `{"stream":"stdout","da`, wantRefusal: true},
		{name: "the guest lives", sent: `{"stream":"stdout","data":"x"}` + "\n", alive: true},
		{name: "the guest lives, before its status", beforeHeaders: true, alive: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			guest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if c.beforeHeaders {
					panic(http.ErrAbortHandler)
				}
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.WriteHeader(200)
				_, _ = io.WriteString(w, c.sent)
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler) // the guest died: its connection breaks
			}))
			defer guest.Close()
			dial := func(ctx context.Context) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", guest.Listener.Addr().String())
			}
			whyBroke := func(_ context.Context, err error) error {
				if c.alive {
					return err
				}
				return &StateError{SessionID: "sess_x", State: session.Failed, Detail: "its guest ended during the exec (reason oom): " + err.Error()}
			}
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, nil))
			front := httptest.NewServer(agentProxy(dial, whyBroke, log))
			defer front.Close()
			var got []string
			_, err := agent.NewHTTPClient(front.Client(), front.URL+"/v1/sessions/sess_x/agent", "").Exec(context.Background(),
				agent.ExecRequest{Argv: []string{"hog"}}, func(ch session.ExecChunk) error { got = append(got, ch.Data); return nil })
			var ae *agent.Error
			refused := errors.As(err, &ae) && ae.Status == 409
			if refused != c.wantRefusal {
				t.Fatalf("exec: %v (%T); want a refusal %v", err, err, c.wantRefusal)
			}
			if refused && (ae.Status != 409 || ae.Code != nodeapi.CodeInvalidState || !strings.Contains(ae.Message, "failed") || !strings.Contains(ae.Message, "reason oom")) {
				t.Errorf("refusal %+v: want 409 invalid_state naming the state and reason", ae)
			}
			if c.beforeHeaders {
				if !refused && !strings.Contains(err.Error(), nodeapi.CodeAgentUnreachable) {
					t.Errorf("exec: %v; want the node's %s", err, nodeapi.CodeAgentUnreachable)
				}
				return // no answer began: nothing broke off to log
			}
			if want := strings.Contains(c.sent, `"data":"x"`); want != (len(got) == 1 && got[0] == "x") {
				t.Errorf("output %q; the guest sent %q", got, c.sent)
			}
			// An answer that stays broken is the node's warning, in its log.
			front.Close()
			if broken := strings.Contains(logged.String(), "level=WARN") && strings.Contains(logged.String(), "body copy"); broken == c.wantRefusal {
				t.Errorf("the node's log %q; want a warning only of an answer that stays broken", logged.String())
			}
		})
	}
}

// TestLayerTooLargeIsAConflict: a snapshot refused for what the guest holds (its files past
// its disk allowance) is the node's 409 invalid_state, which the gateway passes on as a 409
// with the message, not a 500 of the node's own: the caller can shrink the files and retry.
func TestLayerTooLargeIsAConflict(t *testing.T) {
	err := fmt.Errorf("snapshot: checkpoint: %w", fmt.Errorf("oci: snapshot layer: %w of 1073741824 bytes, at workspace/sparse", hypervisor.ErrLayerTooLarge))
	e := apiError(err)
	if e.Status != 409 || e.Code != nodeapi.CodeInvalidState || !strings.Contains(e.Message, "workspace/sparse") {
		t.Errorf("apiError = %+v; want 409 %s naming the file", e, nodeapi.CodeInvalidState)
	}
	if e := apiError(errors.New("runsc checkpoint: exit status 1")); e.Status != 500 {
		t.Errorf("another snapshot failure: %+v; want 500", e)
	}
}

// TestAgentProxyBoundsHeaders: the node's proxy to a guest's agent refuses an answer whose
// headers pass agent.MaxAnswerHeaderBytes (a 502): Go's default let a hostile agent make the
// node, and the gateway it passed them on to, hold 10 MiB of headers for every request.
func TestAgentProxyBoundsHeaders(t *testing.T) {
	guest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		pad := strings.Repeat("x", 56)
		for i := range 16384 {
			w.Header().Set("X-Pad-"+strconv.Itoa(i), pad)
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer guest.Close()
	dial := func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", guest.Listener.Addr().String())
	}
	whyBroke := func(_ context.Context, err error) error { return err }
	front := httptest.NewServer(agentProxy(dial, whyBroke, slog.New(slog.DiscardHandler)))
	defer front.Close()
	resp, err := front.Client().Get(front.URL + "/v1/sessions/sess_x/agent/v1/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || len(resp.Header) > 10 {
		t.Fatalf("an answer under 1 MiB of headers: HTTP %d with %d header fields; want a 502", resp.StatusCode, len(resp.Header))
	}
}
