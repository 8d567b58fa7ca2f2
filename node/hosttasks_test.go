package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/node"
	"wb/session"
	"wb/store"
)

// The node's test driver passes the guests' process total through (hypervisor.HostTasker,
// which the embedded testDriver would hide); over a driver that is none it fails, and the
// node does without.
func (d timedDriver) GuestsTotal() (int64, int64, error) {
	if h, ok := d.testDriver.(hypervisor.HostTasker); ok {
		return h.GuestsTotal()
	}
	return 0, 0, errors.ErrUnsupported
}

func (d timedDriver) GuestsTasks(ctx context.Context) ([]hypervisor.GuestTasks, error) {
	if h, ok := d.testDriver.(hypervisor.HostTasker); ok {
		return h.GuestsTasks(ctx)
	}
	return nil, errors.ErrUnsupported
}

func (d timedDriver) GuestTasks(ctx context.Context, id string) (int64, error) {
	if h, ok := d.testDriver.(hypervisor.HostTasker); ok {
		return h.GuestTasks(ctx, id)
	}
	return 0, errors.ErrUnsupported
}

// fairHost is a node on runtime rt whose guests' common cgroup (GuestsCgroup, with the
// node's CgroupParent below it as cmd/wb lays them out) allows total tasks: written before
// the driver opens, which keeps a lower limit there. The cgroup goes at the test's end.
func fairHost(t *testing.T, rt string, total int) (*running, testDriver, node.Config, string) {
	t.Helper()
	guests := "/wbfairtest-" + randHex(t, 4)
	dir := pidsCgroupDir(guests)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the driver's, which removes its parent below
		// On v1 the runtimes made it in every hierarchy.
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", guests))
		if len(dirs) == 0 {
			dirs = []string{dir}
		}
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove the guests' cgroup: %v", err)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(total)), 0); err != nil {
		t.Fatal(err)
	}
	st, _ := newStore(t)
	d := newDriver(t, rt, tempDir(t), func(o *oci.Options) { o.GuestsCgroup, o.CgroupParent = guests, guests+"/node_fair" })
	cfg := nodeConfig(t, st, d, tempDir(t), "node_fair_"+rt)
	cfg.Metrics = node.NewMetrics()
	return startNode(t, cfg), d, cfg, dir
}

// TestHostTasksHogGivesWay is one tenant's guest taking the host's guests' process total
// (300 here) while another tenant's guest idles beside it on the host: the hog starts
// sleeps until its forks fail (its own limit is 1,024, above the total). The total stays
// full, and the bystander's exec of a few processes fails: its shell cannot fork. The node reads the
// total and, past 85 % of it, has the guest that holds the most above the share (300 over 2)
// give way: its agent ends its processes, whose count (runc: host processes) falls, and the
// bystander answers; the hog's session runs on.
func TestHostTasksHogGivesWay(t *testing.T) {
	const total = 300
	r, _, cfg, dir := fairHost(t, "runc", total)
	const project = "proj_hosttasks"
	by := provision(t, cfg.Store, r.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	hog := provision(t, cfg.Store, r.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	read := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, "pids.current"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	t.Logf("the guests hold %d of %d before the hog", read(), total)

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		// Bounded: 400 sleeps of 2 minutes, and the exec's time limit.
		req, limit := execReq(`for i in $(seq 400); do sleep 120 & done; wait`), 60
		req.TimeoutS = &limit
		res, err := r.Exec(ctxT(t, 2*time.Minute), hog, req, nil, nil)
		t.Logf("the hog's exec: exit %d, timed out %v, err %v: %.300s", res.ExitCode, res.TimedOut, err, res.Stderr)
	})
	// Near the total: seen here, or by the node (its action; the test's tick is 50 ms, and the
	// hog's count can fall before a poll here sees it high).
	peak := 0
	for deadline := time.Now().Add(time.Minute); peak < total*85/100; time.Sleep(10 * time.Millisecond) {
		peak = max(peak, read())
		if strings.Contains(scrape(t, cfg.Metrics), "wb_node_host_process_total_actions_total{") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hog never came near the total of %d (at most %d): this test proves nothing", total, peak)
		}
	}
	// The total is given 20 s to fall well below the mark.
	var trace []string
	t0 := time.Now()
	for read() > total/2 && time.Since(t0) < 20*time.Second {
		if len(trace) < 40 {
			trace = append(trace, fmt.Sprintf("%.1fs:%d", time.Since(t0).Seconds(), read()))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("the guests' total after the hog came near it (peak %d of %d): %s", peak, total, strings.Join(trace, " "))
	if cur := read(); cur > total/2 {
		t.Errorf("the guests held %d of their total of %d for 20 s after one guest took it: nothing made the hog give way", cur, total)
	}
	res, err := execIn(ctxT(t, time.Minute), r.Node, by, modestExec)
	t.Logf("the bystander's exec: %q %q, %v", res.Stdout, res.Stderr, err)
	if err != nil || !strings.Contains(res.Stdout, "alive") {
		t.Errorf("the bystander's exec after the hog took the total: %q %q, %v; want it to answer alive", res.Stdout, res.Stderr, err)
	}
	for _, s := range []*session.Session{by, hog} {
		if got := get(t, cfg.Store, project, s.ID); got.State != session.Running {
			t.Errorf("session %s is %s (%s); want running: ending the hog's processes freed the total", s.ID, got.State, reasonOf(got))
		}
	}
	if m := waitMetric(t, cfg.Metrics, `wb_node_host_process_total_actions_total{outcome="ended"} 1`); !strings.Contains(m, `wb_node_host_process_total_actions_total{outcome="ended"} 1`) {
		t.Errorf("the node's metrics: %s; want one action, ended", grepLines(m, "wb_node_host_process_total"))
	}
}

// TestHostTasksRefillingHogStopped is TestHostTasksHogGivesWay's hog forking again after each
// end, as a tenant's client would: its processes are ended twice, its count falling each time
// (runc), and the third time it takes the total its session is stopped: failed,
// policy_violation, its rule host_process_share saying it took them again. Without that the
// hog held the total at the mark for as long as it forked, each end freeing it for a moment.
func TestHostTasksRefillingHogStopped(t *testing.T) {
	const total = 300
	r, _, cfg, _ := fairHost(t, "runc", total)
	const project = "proj_hosttasks_refill"
	provision(t, cfg.Store, r.Node, project, sessionOpts{idleS: 300, lifeS: 600}) // a bystander
	hog := provision(t, cfg.Store, r.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	fills := 0
	for ; fills < 5; fills++ {
		if got := get(t, cfg.Store, project, hog.ID); got.State != session.Running {
			break
		}
		// Bounded: 400 sleeps of 2 minutes, and the exec's time limit. Its shell exits once it
		// cannot fork (the total is full), its sleeps left holding it.
		req, limit := execReq(`for i in $(seq 400); do sleep 120 & done; wait`), 60
		req.TimeoutS = &limit
		res, err := r.Exec(ctxT(t, 2*time.Minute), hog, req, nil, nil)
		t.Logf("the hog's fill %d: exit %d, timed out %v, err %v: %.200s", fills+1, res.ExitCode, res.TimedOut, err, res.Stderr)
		// The node's action: its processes ended (its count falls), or its session stopped.
		ended := fmt.Sprintf(`wb_node_host_process_total_actions_total{outcome="ended"} %d`, fills+1)
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if strings.Contains(scrape(t, cfg.Metrics), ended) || get(t, cfg.Store, project, hog.ID).State != session.Running {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the hog's fill %d took the total, and the node did nothing for a minute: %s", fills+1, grepLines(scrape(t, cfg.Metrics), "wb_node_host_process_total"))
			}
		}
	}
	got, _ := waitState(t, cfg.Store, project, hog.ID, time.Minute, session.Failed)
	m := scrape(t, cfg.Metrics)
	if got.State != session.Failed || reasonOf(got) != "(policy_violation)" || got.Rule == nil ||
		!strings.HasPrefix(*got.Rule, node.HostTasksRule+": ") || !strings.Contains(*got.Rule, "took them again") || fills != 3 {
		rule := ""
		if got.Rule != nil {
			rule = *got.Rule
		}
		t.Errorf("after %d fills the refilling hog's session is %s %s (rule %q); want failed (policy_violation) after 3, its rule saying it took them again\nmetrics: %s",
			fills, got.State, reasonOf(got), rule, grepLines(m, "wb_node_host_process_total"))
	}
	if !strings.Contains(m, `wb_node_host_process_total_actions_total{outcome="ended"} 2`) || !strings.Contains(m, `wb_node_host_process_total_actions_total{outcome="stopped"} 1`) {
		t.Errorf("the node's metrics: %s; want two actions ended and one stopped", grepLines(m, "wb_node_host_process_total"))
	}
}

// TestHostTasksRunscHogStopped is the cross-tenant attack under runsc: one tenant's sandbox
// ratchets its host tasks up in short bursts of sleeps, a few more each time (under the
// ptrace platform the sandbox keeps every stub process and its threads when they end), to
// 85 % of the host's guests' total (1,000 here), and stays there idle, beside another
// tenant's idle sandbox, whose next processes need the few tasks left (some 20 each).
// (A sandbox that grows into the total itself dies there: the bursts stop short of it, as a
// tenant's bombs ended by its sandbox's own watch do.) Ending the hog's processes does not lower its count, so the node
// stops its session: failed, policy_violation, with the rule host_process_share saying how
// many it held; the total falls, and the bystander answers.
func TestHostTasksRunscHogStopped(t *testing.T) {
	const total = 1000
	const project = "proj_hosttasks_runsc"
	r, cfg, by, hog, tr := runscHogHost(t, project, total)
	read, note := tr.read, tr.note
	note()
	// Bursts, each bounded by itself (N sleeps of a second), the guest's own limit (256 in
	// 1 GiB) and a time limit: each new address space the guest holds at once is a stub
	// process of the sandbox's (some 20 host tasks here), kept when it ends, so N grows by 2
	// each time (a step of 40-odd tasks: 160 left the hog dead at the total); they stop at
	// the mark, where the node acts.
	peak := 0
	for i := 1; i <= 80; i++ {
		if peak = max(peak, note()); peak >= total*85/100 || get(t, cfg.Store, project, hog.ID).State.Terminal() {
			break
		}
		sleepBurst(t, r, hog, i)
	}
	if peak < total*85/100 {
		t.Fatalf("the hog never came near the total of %d (at most %d: %s): this test proves nothing", total, peak, tr)
	}
	// The hog's session is given 20 s to end, and the total to fall below the mark.
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if note() < total*85/100 && get(t, cfg.Store, project, hog.ID).State.Terminal() {
			break
		}
	}
	t.Logf("the guests' total (peak %d of %d): %s", peak, total, tr)
	if cur := read(); cur >= total*85/100 {
		t.Errorf("the guests held %d of their total of %d for 20 s after one guest took most of it: nothing made the hog give way", cur, total)
	}
	got, _ := waitState(t, cfg.Store, project, hog.ID, 10*time.Second, session.Failed, session.Stopped, session.Expired, session.Running)
	if got.State != session.Failed || reasonOf(got) != "(policy_violation)" || got.Rule == nil || !strings.HasPrefix(*got.Rule, node.HostTasksRule+": the session's sandbox held ") {
		t.Errorf("the hog's session is %s (%s, rule %v); want failed, policy_violation, rule %s: …", got.State, reasonOf(got), derefStr(got.Rule), node.HostTasksRule)
	} else {
		t.Logf("the hog's rule: %s", *got.Rule)
	}
	res, err := execIn(ctxT(t, time.Minute), r.Node, by, modestExec)
	t.Logf("the bystander's exec: %q %q, %v", res.Stdout, res.Stderr, err)
	if err != nil || !strings.Contains(res.Stdout, "alive") {
		t.Errorf("the bystander's exec after the hog took most of the total: %q %q, %v; want it to answer alive", res.Stdout, res.Stderr, err)
	}
	if got := get(t, cfg.Store, project, by.ID); got.State != session.Running {
		t.Errorf("the bystander's session is %s (%s); want running", got.State, reasonOf(got))
	}
	if m := waitMetric(t, cfg.Metrics, `wb_node_host_process_total_actions_total{outcome="stopped"} 1`); !strings.Contains(m, `wb_node_host_process_total_actions_total{outcome="stopped"} 1`) {
		t.Errorf("the node's metrics: %s; want one action, stopped", grepLines(m, "wb_node_host_process_total"))
	}
}

// TestHostTasksRunscPausedHogStopped: the hog of TestHostTasksRunscHogStopped ratchets its
// sandbox's host tasks to 60 % of the host's guests' total (its bursts' steps, up to 120
// tasks, stay short of the mark) and is paused there (its tasks stay, frozen); the
// bystander's own processes then take the total past the mark. The node stops the paused
// hog's session (failed, policy_violation, its rule saying it was paused), the total falls,
// and the bystander answers. A paused guest was passed over as one that runs no session:
// the total stayed past the mark.
func TestHostTasksRunscPausedHogStopped(t *testing.T) {
	const total = 1000
	const project = "proj_hosttasks_paused"
	r, cfg, by, hog, tr := runscHogHost(t, project, total)
	read, note := tr.read, tr.note
	for i := 1; i <= 80 && note() < total*60/100; i++ {
		sleepBurst(t, r, hog, i)
	}
	if cur := note(); cur < total*60/100 || cur >= total*85/100 {
		t.Fatalf("the hog took the total to %d of %d (%s), want 60-85 %% before its pause: this test proves nothing", cur, total, tr)
	}
	ctx := ctxT(t, time.Minute)
	if err := r.Pause(ctx, hog); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Store.Transition(ctx, store.Change{Project: project, ID: hog.ID, From: session.Running, To: session.Paused, Driver: session.Caller}); err != nil {
		t.Fatal(err)
	}
	// The bystander's processes take the total past the mark (its own bursts, a few tasks each).
	peak := 0
	for i := 1; i <= 40; i++ {
		if peak = max(peak, note()); peak >= total*85/100 || get(t, cfg.Store, project, hog.ID).State.Terminal() {
			break
		}
		sleepBurst(t, r, by, i)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		peak = max(peak, note())
		if get(t, cfg.Store, project, hog.ID).State.Terminal() && read() < total*85/100 {
			break
		}
	}
	t.Logf("the guests' total (peak %d of %d): %s", peak, total, tr)
	got, _ := waitState(t, cfg.Store, project, hog.ID, 10*time.Second, session.Failed, session.Stopped, session.Expired, session.Paused)
	// The node's action is proof too that the total came past the mark: its look, once a
	// tick, may see it there between two of the test's.
	if peak < total*85/100 && !got.State.Terminal() {
		t.Fatalf("the total never came past the mark (at most %d of %d): this test proves nothing", peak, total)
	}
	if got.State != session.Failed || reasonOf(got) != "(policy_violation)" || got.Rule == nil || !strings.Contains(*got.Rule, "while paused") {
		t.Errorf("the paused hog's session is %s (%s, rule %v); want failed, policy_violation, its rule saying it was paused", got.State, reasonOf(got), derefStr(got.Rule))
	}
	if cur := read(); cur >= total*85/100 {
		t.Errorf("the guests held %d of their total of %d after the paused hog was taken; want below the mark", cur, total)
	}
	res, err := execIn(ctxT(t, time.Minute), r.Node, by, modestExec)
	if err != nil || !strings.Contains(res.Stdout, "alive") {
		t.Errorf("the bystander's exec after the paused hog was stopped: %q %q, %v; want it to answer alive", res.Stdout, res.Stderr, err)
	}
	if got := get(t, cfg.Store, project, by.ID); got.State != session.Running {
		t.Errorf("the bystander's session is %s (%s); want running", got.State, reasonOf(got))
	}
}

// sleepBurst has s start 2i sleeps of a second at once and waits for them (bounded by the
// exec's 20 s): under runsc each new address space the guest holds at once is a stub process
// of its sandbox's, kept when it ends, so bursts of growing i ratchet its host tasks up.
func sleepBurst(t *testing.T, r *running, s *session.Session, i int) {
	req, limit := execReq(fmt.Sprintf(`for i in $(seq %d); do sleep 1 & done; wait`, 2*i)), 20
	req.TimeoutS = &limit
	_, _ = r.Exec(ctxT(t, time.Minute), s, req, nil, nil)
}

// totalTrace reads the guests' process total in the pids cgroup dir and notes each reading
// with its time since the trace began, for a test's log.
// runscHogHost starts a runsc node on a host whose guests may hold total tasks, with two
// sessions of project on it: a bystander, and a hog of 1 GiB (its guest's own limit is 256
// processes); and a trace of the total.
func runscHogHost(t *testing.T, project string, total int) (r *running, cfg node.Config, by, hog *session.Session, tr *totalTrace) {
	t.Helper()
	r, _, cfg, dir := fairHost(t, "runsc", total)
	by = provision(t, cfg.Store, r.Node, project, sessionOpts{idleS: 300, lifeS: 600})
	hog = provision(t, cfg.Store, r.Node, project, sessionOpts{idleS: 300, lifeS: 600,
		res: session.Resources{VCPU: 1, MemoryMiB: 1024, DiskGiB: 1, SizeClass: "m"}})
	return r, cfg, by, hog, newTotalTrace(dir)
}

type totalTrace struct {
	dir    string
	t0     time.Time
	points []string
}

func newTotalTrace(dir string) *totalTrace { return &totalTrace{dir: dir, t0: time.Now()} }

// read answers the total now.
func (tr *totalTrace) read() int {
	b, _ := os.ReadFile(filepath.Join(tr.dir, "pids.current"))
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// note reads the total and notes it.
func (tr *totalTrace) note() int {
	cur := tr.read()
	tr.points = append(tr.points, fmt.Sprintf("%.1fs:%d", time.Since(tr.t0).Seconds(), cur))
	return cur
}

func (tr *totalTrace) String() string { return strings.Join(tr.points, " ") }

// modestExec is a bystander's exec that starts a few processes, as any build or test does.
const modestExec = `for i in 1 2 3 4 5 6 7 8; do sh -c : & done; wait; echo alive`

func derefStr(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// scrape answers the metrics' exposition text.
func scrape(t *testing.T, m *node.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// waitMetric scrapes the metrics until they hold line, for up to a minute (the action is
// counted once the agent answers, which may be after the total fell), and answers the last.
func waitMetric(t *testing.T, m *node.Metrics, line string) string {
	t.Helper()
	got := scrape(t, m)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(got, line) && time.Now().Before(deadline); got = scrape(t, m) {
		time.Sleep(50 * time.Millisecond)
	}
	return got
}

// grepLines answers the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}
