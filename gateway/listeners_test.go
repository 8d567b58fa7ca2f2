package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"wb/internal/syncbuf"
	"wb/session"
)

// TestMetricsNeedsOperator: /metrics answers only the admin key or the metrics token, and
// not at all on the API when the operator serves it on its own address.
func TestMetricsNeedsOperator(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MetricsToken = "wb_metrics_test" })
	for _, key := range []string{"", e.key, "wb_metrics_wrong"} {
		expectError(t, e.do("GET", "/metrics", key, nil), 401, "unauthenticated", "")
	}
	for _, key := range []string{adminKey, "wb_metrics_test"} {
		r := e.do("GET", "/metrics", key, nil)
		if r.status != 200 || !strings.Contains(string(r.body), "wb_http_requests_total") {
			t.Fatalf("/metrics with an operator's key: %d %.200s", r.status, r.body)
		}
	}
	e2 := newEnv(t, func(c *Config) { c.MetricsElsewhere = true })
	expectError(t, e2.do("GET", "/metrics", adminKey, nil), 404, "no_route", "")
}

// leakyGuests fails pauses with an error that names a host path and internal addresses, as
// a node's or runtime's error can.
type leakyGuests struct{ Guests }

const leak = `node node_local: Post "http://127.0.0.1:40417/v1/guests/sess_x/pause": runsc pause: open /var/lib/wb/oci-state/sess_x/state.json: no such file; redis 127.0.0.1:6379, peer [::1]:7070, redis-0.wb.internal:6379, fe80::1%eth0`

func (leakyGuests) Pause(context.Context, *session.Session) error { return errors.New(leak) }

// TestUpstreamErrorsNameNoHostInternals: a node's error reaches the tenant with host paths and
// internal addresses replaced, and the log keeps the detail for the operator.
func TestUpstreamErrorsNameNoHostInternals(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnv(t, func(c *Config) {
		c.Guests = leakyGuests{c.Guests}
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	s := e.running(map[string]any{"tier": 2})
	msg := expectError(t, e.do("POST", "/v1/sessions/"+s.ID+":pause", e.key, nil), 502, "node_error", "")
	for _, secret := range []string{"/var/lib", "127.0.0.1", "40417", "6379", "::1", "7070", "wb.internal", "fe80", "state.json"} {
		if strings.Contains(msg, secret) {
			t.Errorf("the tenant sees %q: %s", secret, msg)
		}
	}
	if !strings.Contains(msg, "could not pause") || !strings.Contains(msg, "no such file") {
		t.Errorf("the message lost what failed: %s", msg)
	}
	if !strings.Contains(logs.String(), "/var/lib/wb/oci-state/sess_x/state.json") || !strings.Contains(logs.String(), "127.0.0.1:6379") {
		t.Errorf("the log lacks the detail:\n%s", logs.String())
	}
}

func TestRedactInternal(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"dial tcp 127.0.0.1:6379: connect: connection refused", "dial tcp <internal address>: connect: connection refused"},
		{"dial unix /var/lib/wb/node/guests/g1/agent/agent.sock: no such file", "dial unix <host path>: no such file"},
		{`Get "http://10.0.0.7:7070/v1/x": EOF`, `Get "<internal address>": EOF`},
		{"lookup redis on [::1]:53: no such host", "lookup redis on <internal address>: no such host"},
		{"peer ::ffff:127.0.0.1 reset", "peer <internal address> reset"},
		{"node-3.example.internal:7070 timed out", "<internal address> timed out"},
		{"the answer ended without a result: unexpected EOF", "the answer ended without a result: unexpected EOF"},
		{"exit status 137 at 12:30:45", "exit status 137 at 12:30:45"},
	} {
		if got := redactInternal(c.in); got != c.want {
			t.Errorf("redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	// Nothing of the original address survives, whatever surrounds it.
	for _, addr := range []string{"127.0.0.1:1234", "/var/lib/wb/x", "[fd00::5]:80", "localhost:8080"} {
		// A Go slice or struct printed with %v ([a b], {a b}), markdown, tags, shell lists.
		for _, f := range []string{"%s", "(%s)", `"%s"`, "x=%s,", "at %s.", "[%s]", "mounts [x %s]", "{%s}", "`%s`", "<%s>", "x;%s", "x|%s"} {
			in := fmt.Sprintf(f, addr)
			if got := redactInternal(in); strings.Contains(got, strings.Trim(addr, "[]/")) {
				t.Errorf("redact(%q) = %q", in, got)
			}
		}
	}
}
