package conformance

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
)

// TestAdversarial attacks a deployment as a hostile tenant and a hostile guest would, and
// prints a table of every attempt and its result (`make security` shows it; go test -v too).
// Two projects: A owns things, B tries to reach them. Each subtest records its attempts; any
// attempt that got through fails the test.
func TestAdversarial(t *testing.T) {
	forEach(t, func(t *testing.T, d *deployment) {
		rep := &report{}
		t.Cleanup(func() { t.Log("\n" + rep.table(d.name)) })
		a, b := d.tenant(t, "adv-a-"+d.name), d.tenant(t, "adv-b-"+d.name)
		t.Run("cross_tenant", func(t *testing.T) { testCrossTenant(t, rep, a, b) })
		t.Run("egress_to_platform", func(t *testing.T) { testEgressToPlatform(t, rep, d, a) })
		t.Run("patch_injection", func(t *testing.T) { testPatchInjection(t, rep, a, b) })
	})
}

// report collects attempts and their outcomes, safe for concurrent use.
type report struct {
	mu   sync.Mutex
	rows []attempt
}

type attempt struct {
	area, what, want, got string
	held                  bool // the boundary held
}

// add records one attempt and fails t when the boundary did not hold.
func (r *report) add(t testing.TB, area, what, want, got string, held bool) {
	t.Helper()
	r.mu.Lock()
	r.rows = append(r.rows, attempt{area, what, want, got, held})
	r.mu.Unlock()
	if !held {
		t.Errorf("%s: %s: want %s, got %s", area, what, want, got)
	}
}

func (r *report) table(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sb strings.Builder
	held := 0
	for _, a := range r.rows {
		if a.held {
			held++
		}
	}
	fmt.Fprintf(&sb, "adversarial suite, %s: %d attempts, %d held, %d got through\n", name, len(r.rows), held, len(r.rows)-held)
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AREA\tATTEMPT\tWANT\tGOT\tRESULT")
	for _, a := range r.rows {
		res := "held"
		if !a.held {
			res = "GOT THROUGH"
		}
		got := a.got
		if len(got) > 70 {
			got = got[:70] + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.area, a.what, a.want, strings.ReplaceAll(got, "\n", " "), res)
	}
	tw.Flush()
	return sb.String()
}

// testCrossTenant: project B calls every route of the API with project A's ids. Nothing
// succeeds, nothing of A's changes, and B's lists show nothing of A's.
func testCrossTenant(t *testing.T, rep *report, a, b *deployment) {
	sess := a.newSession(t, nil)
	a.sh(t, sess.ID, "echo a-secret > /workspace/secret")
	snap := a.snapshot(t, sess.ID, false)
	run, _ := a.run(t, map[string]any{"session_id": sess.ID, "command": "echo hi"})
	a.putPolicy(t, "adv", "enforce", "package wb.admission\n\nwarn contains \"a's policy\" if true\n")
	var wh struct {
		ID string `json:"id"`
	}
	r := a.call(t, "POST", "/v1/webhook_endpoints", map[string]any{"url": "https://hooks.example.com/a", "events": []string{"session.failed"}})
	expect(t, r, 201, "A's webhook endpoint")
	r.decode(t, &wh)

	id := sess.ID
	routes := []struct {
		method, path string
		body         any
	}{
		{"GET", "/v1/sessions/" + id, nil},
		{"PATCH", "/v1/sessions/" + id, map[string]any{"idle_timeout_s": 600}},
		{"POST", "/v1/sessions/" + id + ":pause", nil},
		{"POST", "/v1/sessions/" + id + ":resume", nil},
		{"POST", "/v1/sessions/" + id + ":snapshot", map[string]any{"include_memory": false}},
		{"POST", "/v1/sessions/" + id + "/exec", map[string]any{"command": "cat /workspace/secret"}},
		{"POST", "/v1/sessions/" + id + "/exec?stream=true", map[string]any{"command": "cat /workspace/secret"}},
		{"GET", "/v1/sessions/" + id + "/pty", nil},
		{"GET", "/v1/sessions/" + id + "/files?path=/workspace/secret", nil},
		{"PUT", "/v1/sessions/" + id + "/files?path=/workspace/planted", []byte("b was here")},
		{"DELETE", "/v1/sessions/" + id + "/files?path=/workspace/secret", nil},
		{"POST", "/v1/runs", map[string]any{"session_id": id, "command": "cat /workspace/secret"}},
		{"GET", "/v1/runs/" + run.ID, nil},
		{"GET", "/v1/snapshots/" + snap.ID, nil},
		{"POST", "/v1/sessions", map[string]any{"tier": 2, "restore_from": snap.ID}},
		{"POST", "/v1/sessions", map[string]any{"tier": 2, "policy_id": "pol_adv@1"}},
		{"GET", "/v1/policies/adv", nil},
		{"GET", "/v1/webhook_endpoints/" + wh.ID, nil},
		{"GET", "/v1/webhook_endpoints/" + wh.ID + "/deliveries", nil},
		{"DELETE", "/v1/webhook_endpoints/" + wh.ID, nil},
		{"DELETE", "/v1/snapshots/" + snap.ID, nil},
		{"DELETE", "/v1/sessions/" + id, nil},
	}
	for _, rt := range routes {
		r, err := b.request(bg(t, 2*time.Minute), rt.method, rt.path, rt.body, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.status == 201 && strings.HasPrefix(rt.path, "/v1/sessions") {
			var s sessionObj
			_ = json.Unmarshal(r.body, &s)
			b.deleteSession(s.ID)
		}
		ok := r.status >= 400 && r.status < 500 && !strings.Contains(string(r.body), "a-secret")
		rep.add(t, "cross-tenant", rt.method+" "+rt.path, "4xx", r.String(), ok)
	}
	for _, list := range []string{"/v1/sessions", "/v1/snapshots", "/v1/policies", "/v1/webhook_endpoints"} {
		r := b.call(t, "GET", list, nil)
		leaked := strings.Contains(string(r.body), sess.ID) || strings.Contains(string(r.body), snap.ID) ||
			strings.Contains(string(r.body), wh.ID) || strings.Contains(string(r.body), "pol_adv")
		rep.add(t, "cross-tenant", "GET "+list+" as B", "none of A's ids", fmt.Sprintf("HTTP %d, A's ids listed: %v", r.status, leaked), r.status == 200 && !leaked)
	}
	// A's things are as A left them.
	s := a.getSession(t, sess.ID)
	rep.add(t, "cross-tenant", "A's session after B's attempts", "running", s.State, s.State == "running")
	out := a.sh(t, sess.ID, "cat /workspace/secret; ls /workspace")
	rep.add(t, "cross-tenant", "A's files after B's attempts", "secret kept, nothing planted", out,
		strings.Contains(out, "a-secret") && !strings.Contains(out, "planted"))
	r = a.call(t, "GET", "/v1/snapshots/"+snap.ID, nil)
	rep.add(t, "cross-tenant", "A's snapshot after B's attempts", "200", r.String(), r.status == 200)
	r = a.call(t, "GET", "/v1/webhook_endpoints/"+wh.ID, nil)
	rep.add(t, "cross-tenant", "A's webhook endpoint after B's attempts", "200", r.String(), r.status == 200)
}

// testEgressToPlatform: a guest whose policy allows every egress tries, through its proxy,
// every listening port of wb (the gateway, the node API, the embedded Redis) and a TCP server
// of the test's own on loopback, in every spelling of loopback. No connection is made.
func testEgressToPlatform(t *testing.T, rep *report, d, a *deployment) {
	if !d.local || d.cmd == nil {
		t.Skip("needs a wb serve started by the test, on this machine's loopback")
	}
	a.putPolicy(t, "open", "enforce", "package wb.runtime\n\nallow_egress := true\n")
	s := a.newSession(t, map[string]any{"policy_id": "pol_open"})

	var accepted atomic.Int32
	listen := func(network, addr string) int {
		ln, err := net.Listen(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		return ln.Addr().(*net.TCPAddr).Port
	}
	p4 := strconv.Itoa(listen("tcp4", "127.0.0.1:0"))
	targets := []string{
		"127.0.0.1:" + p4, "0x7f000001:" + p4, "2130706433:" + p4, "127.1:" + p4, "0177.0.0.1:" + p4,
		"127.0.0.1.:" + p4, "localhost:" + p4, "[::ffff:127.0.0.1]:" + p4, "[::ffff:7f00:1]:" + p4, "0.0.0.0:" + p4,
	}
	if ln6, err := net.Listen("tcp6", "[::1]:0"); err == nil {
		ln6.Close()
		targets = append(targets, "[::1]:"+strconv.Itoa(listen("tcp6", "[::1]:0")))
	}
	ports, err := listeningPorts(d.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) < 3 {
		t.Fatalf("wb serve listens on %v: want at least the API, the node and the embedded Redis", ports)
	}
	for _, p := range ports {
		targets = append(targets, "127.0.0.1:"+strconv.Itoa(p))
	}
	for _, tg := range targets {
		// CONNECT through the guest's proxy, and a plain absolute-URI request through it.
		cmd := fmt.Sprintf(`printf 'CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n' | nc -w 3 127.0.0.1 3128 | head -1; wget -q -T 3 -O - http://%s/ 2>&1 | head -c 200; true`, tg, tg, tg)
		res := a.exec(t, s.ID, map[string]any{"command": cmd, "timeout_s": 20})
		out := res.Stdout + res.Stderr
		ok := !strings.Contains(out, " 200 ") && !strings.Contains(out, "+PONG") && !strings.Contains(out, "WB_")
		rep.add(t, "egress", "CONNECT and GET "+tg, "refused", out, ok)
	}
	rep.add(t, "egress", "connections accepted by the test's loopback servers", "0", strconv.Itoa(int(accepted.Load())), accepted.Load() == 0)
	got := a.getSession(t, s.ID)
	rep.add(t, "egress", "the guest's session after the attempts", "running", got.State, got.State == "running")
}

// listeningPorts answers the TCP ports that process pid listens on, from /proc.
func listeningPorts(pid int) ([]int, error) {
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var ports []int
	seen := map[int]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[3] != "0A" || !inodes[fs[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); err == nil && !seen[int(p)] {
				seen[int(p)] = true
				ports = append(ports, int(p))
			}
		}
		fh.Close()
	}
	return ports, nil
}

// testPatchInjection: a tenant's admission policy that fills in restore_from or policy_id
// (another project's snapshot, a policy that is not the caller's) or a reserved wb.* key is
// refused: the patched request is validated again, and those fields are not patchable.
func testPatchInjection(t *testing.T, rep *report, a, b *deployment) {
	victim := b.newSession(t, nil)
	bSnap := b.snapshot(t, victim.ID, false)
	for _, c := range []struct{ what, defaults string }{
		{"restore_from: another project's snapshot", `{"restore_from": "` + bSnap.ID + `"}`},
		{"restore_from: a path", `{"restore_from": "../../../etc"}`},
		{"policy_id: a policy of another project", `{"policy_id": "pol_adv@1"}`},
		{"reserved wb.* metadata", `{"metadata": {"wb.node": "node_local"}}`},
	} {
		name := fmt.Sprintf("inject%d", len(rep.rows))
		a.putPolicy(t, name, "enforce", "package wb.admission\n\ndefaults := "+c.defaults+"\n")
		r := a.call(t, "POST", "/v1/sessions", map[string]any{"tier": 2, "policy_id": "pol_" + name + "@1"})
		if r.status == 201 {
			var s sessionObj
			_ = json.Unmarshal(r.body, &s)
			a.deleteSession(s.ID)
		}
		rep.add(t, "patch", c.what, "4xx", r.String(), r.status >= 400 && r.status < 500)
	}
}

// rssBytes answers the resident set of process pid.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// hostFile finds a regular file named name under dir (a deployment's data dir) and answers
// its owner and mode, without following symlinks.
func hostFile(dir, name string) (found bool, uid uint32, mode fs.FileMode) {
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || found {
			return nil
		}
		if e.Name() == name && e.Type().IsRegular() {
			var st syscall.Stat_t
			if syscall.Lstat(p, &st) == nil {
				found, uid, mode = true, st.Uid, fs.FileMode(st.Mode)
				if st.Mode&syscall.S_ISUID != 0 {
					mode |= fs.ModeSetuid
				}
			}
		}
		return nil
	})
	return
}
