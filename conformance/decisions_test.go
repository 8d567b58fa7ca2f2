package conformance

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPolicyKill: with a policy pinned that forbids a command, running that command fails
// the session with policy_violation and the rule, and the session.failed webhook carries both.
func TestPolicyKill(t *testing.T) {
	forEach(t, func(t *testing.T, d *deployment) {
		if !d.local {
			t.Skip("needs a webhook receiver the deployment can reach")
		}
		d = d.tenant(t, "kill-"+d.name)
		var mu sync.Mutex
		var failed []map[string]any
		recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			var ev struct {
				Type string         `json:"type"`
				Data map[string]any `json:"data"`
			}
			if json.Unmarshal(b, &ev) == nil && ev.Type == "session.failed" {
				mu.Lock()
				failed = append(failed, ev.Data)
				mu.Unlock()
			}
		}))
		defer recv.Close()
		expect(t, d.call(t, "POST", "/v1/webhook_endpoints", map[string]any{"url": recv.URL, "events": []string{"session.failed"}}), 201, "webhook endpoint")
		policy := `package wb.runtime

kill contains "no_wget" if {
	input.type == "exec"
	some arg in input.argv
	contains(arg, "wget")
}
`
		d.putPolicy(t, "build_tools", "enforce", policy)
		s := d.newSession(t, map[string]any{"policy_id": "pol_build_tools@1"})
		if out := d.sh(t, s.ID, "echo allowed"); out != "allowed\n" {
			t.Fatalf("an allowed command: %q", out)
		}
		r := d.call(t, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"command": "wget http://example.com/"})
		expect(t, r, 403, "exec of a forbidden command")
		if e := r.apiError(); e.Error.Code != "policy_violation" || !strings.Contains(e.Error.Message, "no_wget") {
			t.Fatalf("403 does not name the rule: %s", r)
		}
		got := d.waitEnded(t, s.ID, 2*time.Minute)
		if got.State != "failed" || got.StateReason == nil || *got.StateReason != "policy_violation" || got.Rule == nil || *got.Rule != "no_wget" {
			t.Fatalf("session after the kill: %+v", got)
		}
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			mu.Lock()
			n := len(failed)
			mu.Unlock()
			if n > 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(failed) != 1 || failed[0]["reason"] != "policy_violation" || failed[0]["rule"] != "no_wget" {
			t.Fatalf("session.failed webhooks: %v", failed)
		}
	})
}

var (
	examplesOnce sync.Once
	examplesDir  string
	examplesErr  error
)

// buildExamples builds the example plugins from source (GOOS=wasip1, c-shared).
func buildExamples(t *testing.T) string {
	t.Helper()
	examplesOnce.Do(func() {
		wd, _ := os.Getwd()
		root := filepath.Dir(wd)
		examplesDir, examplesErr = os.MkdirTemp("", "wb-plugins-")
		if examplesErr != nil {
			return
		}
		for _, name := range []string{"allowlist", "tiercap", "requiremeta"} {
			cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared", "-o",
				filepath.Join(examplesDir, name+".wasm"), "./plugins/examples/"+name)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				examplesErr = &buildError{name, string(out), err}
				return
			}
		}
	})
	if examplesErr != nil {
		t.Fatal(examplesErr)
	}
	return examplesDir
}

type buildError struct {
	name, out string
	err       error
}

func (e *buildError) Error() string { return "build " + e.name + ": " + e.err.Error() + "\n" + e.out }

func (d *deployment) pushPlugin(t *testing.T, dir, name, query string) {
	t.Helper()
	wasm, err := os.ReadFile(filepath.Join(dir, name+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.request(bg(t, time.Minute), "PUT", "/v1/plugins/"+name+"?"+query, wasm, http.Header{"Content-Type": {"application/wasm"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, r, 201, "PUT /v1/plugins/"+name)
}

// TestPlugins: the example plugins, built from source, through POST /v1/sessions: a deny
// answers 403 with the plugin's reason, an allow passes, a patch is applied.
func TestPlugins(t *testing.T) {
	dir := buildExamples(t)
	forEach(t, func(t *testing.T, d *deployment) {
		d = d.tenant(t, "plugins-"+d.name)
		d.pushPlugin(t, dir, "requiremeta", "points=admission&order=1")
		d.pushPlugin(t, dir, "tiercap", "points=admission&order=2")
		d.pushPlugin(t, dir, "allowlist", "points=admission&order=3")
		var list struct {
			Data []struct {
				Name  string `json:"name"`
				Order int    `json:"order"`
			} `json:"data"`
		}
		d.call(t, "GET", "/v1/plugins", nil).decode(t, &list)
		if len(list.Data) != 3 {
			t.Fatalf("plugins listed: %+v", list)
		}
		meta := map[string]any{"team": "infra", "cost_center": "cc1"}
		// Deny, with the plugin's reason.
		r := d.call(t, "POST", "/v1/sessions", map[string]any{"tier": 2, "template": "tpl_base"})
		expect(t, r, 403, "create without metadata")
		if msg := r.apiError().Error.Message; !strings.Contains(msg, "team") || !strings.Contains(msg, "requiremeta") {
			t.Fatalf("403 message %q does not name the plugin and the missing keys", msg)
		}
		// Allow.
		r = d.call(t, "POST", "/v1/sessions", map[string]any{"tier": 2, "template": "tpl_base", "metadata": meta})
		expect(t, r, 201, "create with metadata")
		var s sessionObj
		r.decode(t, &s)
		d.track(s.ID)
		t.Cleanup(func() { d.deleteSession(s.ID) })
		// Patch: a free_ end user's tier is lowered to 1.
		r = d.call(t, "POST", "/v1/sessions", map[string]any{"tier": 2, "template": "tpl_base", "end_user_id": "free_bob", "metadata": meta})
		expect(t, r, 201, "create for a free user")
		r.decode(t, &s)
		d.track(s.ID)
		t.Cleanup(func() { d.deleteSession(s.ID) })
		if s.Tier != 1 || !strings.Contains(r.header.Get("Warning"), "tier") {
			t.Fatalf("tiercap's patch not applied: tier %d, Warning %q", s.Tier, r.header.Get("Warning"))
		}
		// Bad uploads are refused with the reason.
		r, _ = d.request(bg(t, 30*time.Second), "PUT", "/v1/plugins/junk", []byte("not wasm"), http.Header{"Content-Type": {"application/wasm"}})
		expect(t, r, 400, "PUT a module that is not wasm")
		expect(t, d.call(t, "DELETE", "/v1/plugins/allowlist", nil), 200, "DELETE plugin")
		expect(t, d.call(t, "GET", "/v1/plugins/allowlist", nil), 404, "GET deleted plugin")
	})
}

// TestPolicyKillOnResources: a runtime rule on the node's resource samples kills a session
// that burns CPU.
func TestPolicyKillOnResources(t *testing.T) {
	forEach(t, func(t *testing.T, d *deployment) {
		d = d.tenant(t, "res-"+d.name)
		policy := `package wb.runtime

kill contains "cpu_hog" if {
	input.type == "resource_sample"
	input.cpu_ms > 500
}
`
		d.putPolicy(t, "no_hogs", "enforce", policy)
		s := d.newSession(t, map[string]any{"policy_id": "pol_no_hogs"})
		d.sh(t, s.ID, "(while :; do :; done) >/dev/null 2>&1 &")
		got := d.waitEnded(t, s.ID, 2*time.Minute)
		if got.State != "failed" || got.Rule == nil || *got.Rule != "cpu_hog" {
			t.Fatalf("a CPU hog under a cpu_hog rule: %+v", got)
		}
	})
}

// TestEgress: guests have no network; a policy that allows a host:port opens it through the
// node's proxy. A direct connection fails, an allowed one works and is counted, a denied one
// is refused, and one a kill rule names (the cloud metadata address) kills the session.
func TestEgress(t *testing.T) {
	forEach(t, func(t *testing.T, d *deployment) {
		if !d.local {
			t.Skip("needs servers on the deployment's loopback")
		}
		d = d.tenant(t, "egress-"+d.name)
		var hits [2]atomic.Int32
		var addrs [2]string
		for i := range 2 {
			ln, err := net.Listen("tcp", "127.0.0.2:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits[i].Add(1)
				io.WriteString(w, "hello from the host\n")
			})}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			addrs[i] = ln.Addr().String()
		}
		_, allowedPort, _ := net.SplitHostPort(addrs[0])
		policy := `package wb.runtime

allow_egress if {
	input.type == "egress"
	input.host == "127.0.0.2"
	input.port == ` + allowedPort + `
}
`
		d.putPolicy(t, "egress", "enforce", policy)
		s := d.newSession(t, map[string]any{"policy_id": "pol_egress"})
		host, port, _ := net.SplitHostPort(addrs[0])
		if out := d.sh(t, s.ID, "nc -w 2 "+host+" "+port+" </dev/null >/dev/null 2>&1; echo direct=$?"); !strings.Contains(out, "direct=1") {
			t.Errorf("a direct connection from the guest: %q (want it to fail)", out)
		}
		if hits[0].Load() != 0 {
			t.Fatal("the direct connection reached the host")
		}
		if out := d.sh(t, s.ID, "wget -q -O - http://"+addrs[0]+"/ 2>&1; echo rc=$?"); !strings.Contains(out, "hello from the host") {
			t.Fatalf("an allowed host:port through the proxy: %q", out)
		}
		if out := d.sh(t, s.ID, "wget -q -O - http://"+addrs[1]+"/ 2>&1; echo rc=$?"); strings.Contains(out, "hello") || hits[1].Load() != 0 {
			t.Fatalf("a denied host:port went through: %q", out)
		}
		// egress_bytes reaches usage_to_date with the next usage record.
		deadline := time.Now().Add(60 * time.Second)
		for {
			var got struct {
				Usage struct {
					EgressBytes int64 `json:"egress_bytes"`
				} `json:"usage_to_date"`
			}
			d.call(t, "GET", "/v1/sessions/"+s.ID, nil).decode(t, &got)
			if got.Usage.EgressBytes > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("egress_bytes still 0")
			}
			time.Sleep(200 * time.Millisecond)
		}
		// The platform's kill rule on the cloud metadata address stops the session.
		// The kill can land while the exec still runs: its answer is then 409, the guest ended
		// during the exec (busybox wget crashes with -T, so the exec has no timeout of its own).
		r := d.call(t, "POST", "/v1/sessions/"+s.ID+"/exec", map[string]any{"command": "wget -q -O - http://169.254.169.254/latest/ >/dev/null 2>&1; true"})
		if r.status != 200 && (r.status != 409 || r.apiError().Error.Code != "invalid_state") {
			t.Fatalf("exec of the egress to the metadata address: want HTTP 200, or 409 as the kill ends the guest; got %s", r)
		}
		got := d.waitEnded(t, s.ID, 2*time.Minute)
		if got.State != "failed" || got.Rule == nil || *got.Rule != "metadata_egress" {
			t.Fatalf("after egress to the metadata address: %+v", got)
		}
	})
}

// TestPolicyKillOnProcessStart: a process that a runtime rule forbids, started indirectly (not
// the exec's own command), is seen by the node and kills the session.
func TestPolicyKillOnProcessStart(t *testing.T) {
	forEach(t, func(t *testing.T, d *deployment) {
		d = d.tenant(t, "proc-"+d.name)
		policy := `package wb.runtime

kill contains "no_sleepers" if {
	input.type == "process_start"
	some arg in input.argv
	arg == "3333"
}
`
		d.putPolicy(t, "procs", "enforce", policy)
		s := d.newSession(t, map[string]any{"policy_id": "pol_procs"})
		d.sh(t, s.ID, "(sleep 3333) >/dev/null 2>&1 &")
		got := d.waitEnded(t, s.ID, 2*time.Minute)
		if got.State != "failed" || got.Rule == nil || *got.Rule != "no_sleepers" {
			t.Fatalf("a forbidden process left running: %+v", got)
		}
	})
}

// ended is a session after its end: its state, reason and rule.
type ended struct {
	State       string  `json:"state"`
	StateReason *string `json:"state_reason"`
	Rule        *string `json:"rule"`
}

// waitEnded polls the session until it is terminal or timeout passes, and answers what it saw.
func (d *deployment) waitEnded(t *testing.T, id string, timeout time.Duration) ended {
	t.Helper()
	var got ended
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		d.call(t, "GET", "/v1/sessions/"+id, nil).decode(t, &got)
		if terminal[got.State] {
			break
		}
	}
	return got
}

// putPolicy uploads Rego as the deployment's project and expects 201.
func (d *deployment) putPolicy(t *testing.T, name, mode, src string) {
	t.Helper()
	r, err := d.request(bg(t, 30*time.Second), "PUT", "/v1/policies/"+name+"?mode="+mode, []byte(src), http.Header{"Content-Type": {"text/plain"}})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, r, 201, "PUT /v1/policies/"+name)
}
