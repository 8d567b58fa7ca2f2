package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/client"
	"wb/internal/fleet"
	"wb/internal/wbbin"
	"wb/session"
	"wb/store"
)

const (
	project = "proj_dev" // the project the gateways' API key belongs to
	// hostFailureWithin is the contract's bound (seed 000, failure semantics).
	hostFailureWithin = 10 * time.Second
)

// env is a started fleet and a client on each gateway.
type env struct {
	f  *fleet.Fleet
	c  []*client.Client
	bg context.Context
	tm timings
}

// startFleet starts a fleet whose nodes each hold two sessions of size s (1 vCPU, 2 GiB), and
// lets the dev project use all of any node (its plan's node_share_pct, 50 by default). It
// checks at the end that Stop left no guest, cgroup, process or file. tune changes the
// fleet's options before it starts.
func startFleet(t *testing.T, tune ...func(*fleet.Options)) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runc guests need root")
	}
	for _, bin := range []string{"runc", "busybox", "redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	// Not t.TempDir(): the test's name would make the guests' Unix socket paths too long.
	tmp, err := os.MkdirTemp("", "wbc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o755); err != nil { // the guests' user reaches the agent binary
		t.Fatal(err)
	}
	bin, err := wbbin.Install(tmp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A pending session's deadline is 3 × the tier's cold p95: a session that waits for room
	// must outlive the test's steps.
	slow := []string{"--cold-p95", "2=20s"}
	// The gateways find a dead node after wb serve's default --node-timeout, which must keep
	// the contract's 10 s; WB_CHAOS_NODE_TIMEOUT sets another, to measure it.
	tm, err := loadTimings()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("timings %v", tm)
	o := fleet.Options{Dir: filepath.Join(tmp, "f"), Bin: bin, Runtime: "runc",
		NodeVCPU: 2, NodeMemoryMiB: 4096, NodeTimeout: tm.nodeTimeout, ClusterNodeTimeout: tm.clusterNodeTimeout,
		NodeArgs: slow, Logf: t.Logf,
		// A webhook receiver on loopback.
		GatewayArgs: append(append(slices.Clip(slow), "--allow-private-webhooks"), tm.gatewayArgs()...)}
	for _, fn := range tune {
		fn(&o)
	}
	f, err := fleet.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{f: f, bg: context.Background(), tm: tm}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fleet logs:\n%s", f.Logs())
		}
		if err := f.Stop(context.Background()); err != nil {
			t.Errorf("fleet stop: %v", err)
		}
		checkNothingLeft(t, f, filepath.Join(tmp, "f"))
	})
	for _, u := range f.GatewayURLs {
		c, err := client.New(u, f.APIKey)
		if err != nil {
			t.Fatal(err)
		}
		e.c = append(e.c, c)
	}
	e.admin(t, "PUT", "/v1/admin/projects/"+project+"/plan", map[string]any{"node_share_pct": 100}, nil)
	// The cases sum the usage records of the project's stream (recordedMs, usageRecords), which
	// the settler trims of what every consumer group has read: a group of the tests' own that
	// reads nothing keeps every record there.
	if err := f.Redis.XGroupCreateMkStream(ctx, store.ProjectKeys(project).UsageStream(), "chaos-audit", "0").Err(); err != nil {
		t.Fatal(err)
	}
	return e
}

// figure logs one of a case's figures on a line of its own that begins "figure (<timings>
// timings):", which make bench-fleet picks out of the suite's log.
func (e *env) figure(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("figure (%s timings): %s", e.tm.name, fmt.Sprintf(format, args...))
}

// checkNothingLeft: after Stop, no cgroup of any node's guests (a cgroup goes only when its
// processes have), and no fleet directory.
func checkNothingLeft(t *testing.T, f *fleet.Fleet, dir string) {
	for _, n := range f.Nodes {
		for _, root := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
			if _, err := os.Stat(root + n.CgroupParent()); err == nil {
				t.Errorf("after Stop, %s%s is still there", root, n.CgroupParent())
			}
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Stop, the fleet's directory %s: %v", dir, err)
	}
}

// admin calls an admin route of the first gateway.
func (e *env) admin(t *testing.T, method, path string, body, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(e.bg, method, e.f.GatewayURLs[0]+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.f.AdminKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var msg bytes.Buffer
		_, _ = msg.ReadFrom(resp.Body)
		t.Fatalf("%s %s: %s %s", method, path, resp.Status, msg.String())
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

func (e *env) drain(t *testing.T, node string, on bool) {
	t.Helper()
	e.admin(t, "PUT", "/v1/admin/nodes/"+node+"/draining", map[string]any{"draining": on}, nil)
}

// create makes a tier 2 session of size s through gateway i.
func (e *env) create(t *testing.T, i int, restore string) *session.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.bg, time.Minute)
	defer cancel()
	s, err := e.c[i%len(e.c)].CreateSession(ctx, client.CreateSessionRequest{Tier: 2, Resources: &client.ResourceRequest{SizeClass: "s"},
		IdleTimeoutS: 1200, MaxLifetimeS: 3600, RestoreFrom: restore})
	if err != nil {
		t.Fatalf("create through gateway %d: %v", i%len(e.c)+1, err)
	}
	return s
}

// waitState waits (through gateway i) until the session is in one of states.
func (e *env) waitState(t *testing.T, i int, id string, within time.Duration, states ...session.State) *session.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.bg, within)
	defer cancel()
	s, err := e.c[i%len(e.c)].WaitSession(ctx, id, states...)
	if err != nil {
		t.Fatalf("session %s: %v (reason %v)", id, err, reasonOf(s))
	}
	return s
}

func reasonOf(s *session.Session) string {
	if s == nil || s.StateReason == nil {
		return ""
	}
	return string(*s.StateReason)
}

func zoneOf(s *session.Session) string {
	if s.Zone == nil {
		return ""
	}
	return *s.Zone
}

// nodeOf answers the fleet's node in the session's zone (each node has a zone of its own).
func (e *env) nodeOf(t *testing.T, s *session.Session) *fleet.Node {
	t.Helper()
	for _, n := range e.f.Nodes {
		if n.Zone == zoneOf(s) {
			return n
		}
	}
	t.Fatalf("session %s is in zone %q, which no node has", s.ID, zoneOf(s))
	return nil
}

func (e *env) exec(t *testing.T, i int, id, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.bg, time.Minute)
	defer cancel()
	res, err := e.c[i%len(e.c)].Exec(ctx, id, client.ExecRequest{Command: cmd})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %+v, %v", cmd, id, res, err)
	}
	return res.Stdout
}

func (e *env) delete(t *testing.T, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.bg, time.Minute)
	defer cancel()
	if _, err := e.c[0].DeleteSession(ctx, id); err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
	e.waitState(t, 1, id, time.Minute, session.Stopped, session.Failed)
}

// snapshot takes a disk snapshot of id (runc keeps no memory) and waits until it is ready.
func (e *env) snapshot(t *testing.T, i int, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(e.bg, 2*time.Minute)
	defer cancel()
	c := e.c[i%len(e.c)]
	snap, err := c.SnapshotSession(ctx, id, client.SnapshotRequest{})
	if err != nil {
		t.Fatalf("snapshot %s: %v", id, err)
	}
	for snap.State != "ready" {
		if snap.State == "failed" {
			t.Fatalf("snapshot %s of %s failed: %+v", snap.ID, id, snap)
		}
		time.Sleep(200 * time.Millisecond)
		if snap, err = c.GetSnapshot(ctx, snap.ID); err != nil {
			t.Fatalf("snapshot %s: %v", snap.ID, err)
		}
	}
	e.waitState(t, i, id, time.Minute, session.Running)
	return snap.ID
}

// activeSlots answers how many concurrency slots the project holds.
func (e *env) activeSlots(t *testing.T) int64 {
	t.Helper()
	n, err := store.New(e.f.Redis).ActiveCount(e.bg, project)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFleet starts the fleet and, in order: sessions created through both gateways spread
// over the three nodes and no node takes more than its capacity (a seventh waits until one
// ends); a session snapshotted on node A is restored on node B with its files; and a node
// killed with SIGKILL (chaos): its sessions fail with host_failure within 10 s, their slots
// and the node's room are released, their usage is settled exactly once and stops at the
// last record, and a session restored from one's snapshot runs on another node. Between
// them: a webhook receiver down, then back (webhooks_test.go), and the Redis Cluster primary
// of the project's slot killed (redis_test.go); both before the node is killed, while all
// three nodes have room.
func TestFleet(t *testing.T) {
	t.Parallel() // beside TestGateways: each has a fleet of its own, and mostly waits on it
	e := startFleet(t)
	t.Run("spread and capacity", e.spreadAndCapacity)
	t.Run("restore on another node", e.restoreElsewhere)
	t.Run("webhook receiver down", e.webhookReceiverDown)
	t.Run("redis primary killed", e.redisPrimaryKilled)
	t.Run("node killed", e.nodeKilled)
}

func (e *env) spreadAndCapacity(t *testing.T) {
	const room = 6 // three nodes of two
	var ss []*session.Session
	for i := range room + 1 {
		ss = append(ss, e.create(t, i, ""))
	}
	// Wait until six run; the seventh, whichever it is, finds no room.
	var running []*session.Session
	var pending *session.Session
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		running, pending = nil, nil
		for i, s := range ss {
			got, err := e.c[(i+1)%2].GetSession(e.bg, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case got.State == session.Running:
				running = append(running, got)
			case got.State.Terminal():
				t.Fatalf("session %s is %s (%s)", got.ID, got.State, reasonOf(got))
			default:
				pending = got
			}
		}
		if len(running) >= room || time.Now().After(deadline) {
			break
		}
	}
	if len(running) != room || pending == nil {
		t.Fatalf("%d of 7 sessions run, want %d (the nodes' room)", len(running), room)
	}
	perZone := map[string]int{}
	for _, s := range running {
		perZone[zoneOf(s)]++
	}
	if len(perZone) != 3 {
		t.Fatalf("running sessions by zone: %v, want all three nodes used", perZone)
	}
	for z, n := range perZone {
		if n > 2 {
			t.Fatalf("zone %s runs %d sessions, over its node's room of 2 (%v)", z, n, perZone)
		}
	}
	// The seventh finds no room: it stays pending while the nodes are full.
	time.Sleep(3 * time.Second)
	last, err := e.c[1].GetSession(e.bg, pending.ID)
	if err != nil {
		t.Fatal(err)
	}
	if last.State != session.Pending {
		t.Fatalf("the seventh session is %s in zone %q with every node full, want pending (%v)", last.State, zoneOf(last), perZone)
	}
	var nodes struct {
		Data []store.NodeInfo `json:"data"`
	}
	e.admin(t, "GET", "/v1/admin/nodes", nil, &nodes)
	for _, n := range nodes.Data {
		if n.UsedVCPU > n.VCPU || n.UsedMemoryMiB > n.MemoryMiB {
			t.Errorf("node %s uses %d vCPU / %d MiB of %d / %d", n.ID, n.UsedVCPU, n.UsedMemoryMiB, n.VCPU, n.MemoryMiB)
		}
	}
	e.figure(t, "six sessions through both gateways, by zone: %v; the seventh waits", perZone)

	// One ends: the seventh takes its room, on its node.
	freed := zoneOf(running[0])
	e.delete(t, running[0].ID)
	got := e.waitState(t, 0, pending.ID, 2*time.Minute, session.Running)
	if zoneOf(got) != freed {
		t.Errorf("the seventh session runs in zone %s, want %s, the only one with room", zoneOf(got), freed)
	}
	for _, s := range append(running[1:], got) {
		e.delete(t, s.ID)
	}
	if n := e.activeSlots(t); n != 0 {
		t.Errorf("the project holds %d slots after deleting every session", n)
	}
}

func (e *env) restoreElsewhere(t *testing.T) {
	a := e.waitState(t, 0, e.create(t, 0, "").ID, 2*time.Minute, session.Running)
	e.exec(t, 0, a.ID, "echo kept-on-"+zoneOf(a)+" > /workspace/f")
	snap := e.snapshot(t, 1, a.ID)
	e.delete(t, a.ID)
	nodeA := e.nodeOf(t, a)
	e.drain(t, nodeA.ID, true) // so the restore cannot land where the snapshot was taken
	defer e.drain(t, nodeA.ID, false)
	b := e.waitState(t, 1, e.create(t, 1, snap).ID, 2*time.Minute, session.Running)
	if zoneOf(b) == zoneOf(a) {
		t.Fatalf("the restored session runs in zone %s, where the snapshot was taken", zoneOf(b))
	}
	if got := e.exec(t, 0, b.ID, "cat /workspace/f"); got != "kept-on-"+zoneOf(a)+"\n" {
		t.Fatalf("the restored session's /workspace/f reads %q", got)
	}
	e.figure(t, "snapshot %s taken on %s (zone %s), restored on zone %s with its files", snap, nodeA.ID, zoneOf(a), zoneOf(b))
	e.delete(t, b.ID)
}

func (e *env) nodeKilled(t *testing.T) {
	// Four sessions on three nodes of two: one node runs two.
	var ss []*session.Session
	for i := range 4 {
		ss = append(ss, e.create(t, i, ""))
	}
	byNode := map[string][]*session.Session{}
	for i, s := range ss {
		s = e.waitState(t, i, s.ID, 2*time.Minute, session.Running)
		byNode[zoneOf(s)] = append(byNode[zoneOf(s)], s)
	}
	var victims []*session.Session
	for _, v := range byNode {
		if len(v) > len(victims) {
			victims = v
		}
	}
	dead := e.nodeOf(t, victims[0])
	e.exec(t, 0, victims[0].ID, "echo before-the-kill > /workspace/f")
	snap := e.snapshot(t, 0, victims[0].ID)
	// Each victim has a settled usage record (the node flushes every 4 s), so that there is
	// something billed to lose or to bill twice.
	for _, v := range victims {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if s, err := e.c[1].GetSession(e.bg, v.ID); err == nil && s.UsageToDate.SessionS >= 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no usage settled for %s within a minute", v.ID)
			}
		}
	}
	slotsBefore := e.activeSlots(t)

	dead.Kill()
	killed := time.Now()
	var slowest time.Duration
	for _, v := range victims {
		var s *session.Session
		for {
			var err error
			if s, err = e.c[1].GetSession(e.bg, v.ID); err != nil {
				t.Fatal(err)
			}
			if s.State.Terminal() || time.Since(killed) > time.Minute {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(killed)
		if s.State != session.Failed || reasonOf(s) != string(session.HostFailure) {
			t.Fatalf("session %s on the killed %s is %s (%s) after %v, want failed (host_failure)", v.ID, dead.ID, s.State, reasonOf(s), took)
		}
		slowest = max(slowest, took)
	}
	timeout := "wb serve's default"
	if e.tm.nodeTimeout > 0 {
		timeout = e.tm.nodeTimeout.String()
	}
	e.figure(t, "kill -9 of %s with %d running sessions: each failed with host_failure, the last %.1fs after the kill (--node-timeout %s, bound %v)",
		dead.ID, len(victims), slowest.Seconds(), timeout, hostFailureWithin)
	if slowest > hostFailureWithin {
		t.Errorf("host_failure came %v after the kill, want within %v", slowest, hostFailureWithin)
	}

	// Slots: the project holds those of the survivors only; the dead node is forgotten.
	if n := e.activeSlots(t); n != slotsBefore-int64(len(victims)) {
		t.Errorf("the project holds %d slots after its %d sessions on %s failed, want %d", n, len(victims), dead.ID, slotsBefore-int64(len(victims)))
	}
	use, err := store.New(e.f.Redis).NodeUsage(e.bg, project)
	if err != nil {
		t.Fatal(err)
	}
	if u := use[dead.ID]; u.VCPU != 0 || u.MemoryMiB != 0 {
		t.Errorf("the project still holds %+v on the dead %s", u, dead.ID)
	}

	// Usage: each record the node wrote is settled exactly once, and nothing is billed after.
	for _, v := range victims {
		recorded := e.recordedMs(t, v.ID)
		settled := e.settledMs(t, v.ID, recorded)
		if settled != recorded {
			t.Errorf("session %s: settled %d ms, but its usage records sum to %d ms", v.ID, settled, recorded)
		}
		ran := killed.Sub(v.StartedAt.Time)
		if time.Duration(settled)*time.Millisecond > ran+time.Second {
			t.Errorf("session %s: billed %d ms, but it ran %v before its node died", v.ID, settled, ran)
		}
		e.figure(t, "session %s: ran %.1fs until the kill; its records sum to %d ms, settled %d ms (billing stops at the last record)",
			v.ID, ran.Seconds(), recorded, settled)
	}
	time.Sleep(5 * time.Second) // longer than a flush: were anyone still metering, it shows
	for _, v := range victims {
		if again, recorded := e.settledMs(t, v.ID, -1), e.recordedMs(t, v.ID); again != recorded {
			t.Errorf("session %s: settled %d ms, records %d ms, after the failure", v.ID, again, recorded)
		}
	}

	// A new session from a victim's snapshot runs on another node, with the victim's files.
	r := e.waitState(t, 1, e.create(t, 1, snap).ID, 2*time.Minute, session.Running)
	if zoneOf(r) == dead.Zone {
		t.Fatalf("the restored session runs in zone %s, the dead node's", zoneOf(r))
	}
	if got := e.exec(t, 1, r.ID, "cat /workspace/f"); got != "before-the-kill\n" {
		t.Fatalf("the restored session's /workspace/f reads %q", got)
	}
	e.figure(t, "snapshot %s of a session of the killed %s restored in zone %s", snap, dead.ID, zoneOf(r))
}

// recordedMs sums session_ms over the session's usage records in the project's usage stream,
// each seq once (a record sent twice is one record).
func (e *env) recordedMs(t *testing.T, id string) int64 {
	t.Helper()
	msgs, err := e.f.Redis.XRange(e.bg, store.ProjectKeys(project).UsageStream(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var sum int64
	for _, m := range msgs {
		if m.Values["session"] != id {
			continue
		}
		seq := fmt.Sprint(m.Values["seq"])
		if seen[seq] {
			continue
		}
		seen[seq] = true
		ms, _ := strconv.ParseInt(fmt.Sprint(m.Values["session_ms"]), 10, 64)
		sum += ms
	}
	return sum
}

// settledMs answers the session's settled session time, waiting up to 30 s for it to reach
// want (-1: answers at once).
func (e *env) settledMs(t *testing.T, id string, want int64) int64 {
	t.Helper()
	key := "wb:{" + project + "}:s:" + id // the session's hash (store/keys.go)
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := e.f.Redis.HGet(e.bg, key, "u_ms").Result()
		if err != nil && !strings.Contains(err.Error(), "nil") {
			t.Fatal(err)
		}
		got, _ := strconv.ParseInt(v, 10, 64)
		if want < 0 || got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(200 * time.Millisecond)
	}
}
