package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"wb/internal/fleet"
	"wb/internal/servetest"
	"wb/internal/testwait"
	"wb/internal/wbbin"
)

// deployment is one running wb platform the tests talk to: either the external one named by
// WB_URL and WB_API_KEY, or a `wb serve` process started by TestMain.
type deployment struct {
	name    string // subtest name: the runtime, or "external"
	runtime string // runsc, runc, or "" when unknown (external)
	url     string
	apiKey  string
	admin   string
	local   bool // on this machine's loopback (benchmarks run only then)

	// Set when TestMain started the process.
	bin     string
	tmp     string // holds data/, stdout, stderr
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	prevLog string // stderr of the processes restart replaced

	// server is the deployment that owns the process, for a tenant's view of it (tenant):
	// its log is the server's.
	server *deployment

	mu      sync.Mutex
	created []string // session ids the tests made
}

var (
	deployments []*deployment
	binPath     string // the wb binary TestMain built ("" for an external deployment)
)

func TestMain(m *testing.M) {
	// Most of the time is spent waiting on guests: allow more parallel tests than cores.
	testwait.Parallel(8)
	code := run(m)
	if examplesDir != "" { // built by the first test that needed the example plugins
		os.RemoveAll(examplesDir)
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	if u, k := os.Getenv("WB_URL"), os.Getenv("WB_API_KEY"); u != "" && k != "" {
		deployments = []*deployment{{name: "external", url: strings.TrimRight(u, "/"), apiKey: k,
			admin: os.Getenv("WB_ADMIN_KEY"), local: isLoopback(u)}}
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "wb-conformance-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 1
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // runc's guest root must reach the wb binary (the agent)
		fmt.Fprintln(os.Stderr, "conformance:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binPath, err = wbbin.Install(tmp)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance: build wb:", err)
		return 1
	}
	runtimes := []string{"runsc", "runc"}
	ds := make([]*deployment, len(runtimes))
	errs := make([]error, len(runtimes))
	var wg sync.WaitGroup
	// --plugin-timeout 1s: the plugins' 20 ms default is a production budget; a cold make test
	// starves the CPU past it, and the tests here check what plugins decide, not how fast.
	for i, rt := range runtimes {
		wg.Go(func() {
			ds[i], errs[i] = startServer(binPath, rt, "--pool", "1", "--desktop-pool", "0", "--plugin-timeout", "1s")
		})
	}
	wg.Wait()
	defer func() {
		for _, d := range ds {
			if d != nil {
				d.stop()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: start wb serve:", err)
		return 1
	}
	deployments = ds
	code := m.Run()
	if code != 0 {
		// Stopped first: the server's shutdown logs what it still had in flight (a guest's
		// start that never ended fails with the step it was in), which the log then shows.
		for _, d := range ds {
			d.terminate()
			d.printStderr()
		}
	}
	return code
}

func isLoopback(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// startServer runs `wb serve` on a free loopback port with its own data dir and waits (bounded)
// for its three stdout lines.
func startServer(bin, rt string, extra ...string) (*deployment, error) {
	tmp, err := os.MkdirTemp("", "wb-conf-"+rt+"-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // runc's guest root is an unprivileged uid: it must reach the data dir
		return nil, err
	}
	d := &deployment{name: rt, runtime: rt, local: true, bin: bin, tmp: tmp, exited: make(chan struct{})}
	stdout, err := os.Create(filepath.Join(tmp, "stdout"))
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(tmp, "stderr"))
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	// The tests' webhook receivers listen on 127.0.0.1, and TestEgress's servers on
	// 127.0.0.2: both are opened on purpose; the rest of loopback stays denied. A test that
	// needs the default passes "--allow-private-webhooks=false" in extra (the last one wins).
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(tmp, "data"), "--runtime", rt,
		"--allow-private-webhooks", "--egress-allow-cidr", "127.0.0.2/32"},
		// The suite checks the contract, not this machine's speed: beside other packages'
		// guests, five runsc sessions created at once once took over 30 s to start.
		append(servetest.LoadedColdStarts(), extra...)...)
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		// wb serve takes its keys from these when set; let it make fresh ones.
		if !strings.HasPrefix(kv, "WB_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// If this test process dies, so does the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	d.cmd = cmd
	go func() { d.waitErr = cmd.Wait(); close(d.exited) }()

	deadline := time.Now().Add(3 * time.Minute) // a fresh machine's first start does the most
	for {
		vals := readEnvLines(filepath.Join(tmp, "stdout"))
		if vals["WB_URL"] != "" && vals["WB_API_KEY"] != "" && vals["WB_ADMIN_KEY"] != "" {
			d.url, d.apiKey, d.admin = vals["WB_URL"], vals["WB_API_KEY"], vals["WB_ADMIN_KEY"]
			return d, nil
		}
		select {
		case <-d.exited:
			err := fmt.Errorf("wb serve --runtime %s exited before printing WB_URL, WB_API_KEY, WB_ADMIN_KEY (%v); stderr:\n%s", rt, d.waitErr, d.stderrTail(100))
			d.stop()
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("wb serve --runtime %s printed no WB_URL/WB_API_KEY/WB_ADMIN_KEY within 3 minutes; stderr:\n%s", rt, d.stderrTail(100))
			d.stop()
			return nil, err
		}
	}
}

func readEnvLines(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			out[k] = v
		}
	}
	return out
}

// stop sends SIGTERM, then SIGKILL after 10 s, reaps what the server left, and removes the
// data dir.
func (d *deployment) stop() {
	if d.cmd == nil {
		return
	}
	d.terminate()
	// wb serve destroys its guests as it stops (its Redis, and so its sessions, end with it);
	// one killed leaves them, and their cgroups, to this.
	if err := fleet.Reap(context.Background(), d.runtime, filepath.Join(d.tmp, "data"), fleet.ServeNodeID); err != nil {
		fmt.Fprintf(os.Stderr, "conformance: wb serve (%s) left guests: %v\n", d.name, err)
	}
	fleet.UnmountUnder(d.tmp)
	if !mountedBelow(d.tmp) {
		_ = os.RemoveAll(d.tmp)
	}
}

// terminate stops the server process, gracefully if it lets itself be, and waits for it.
func (d *deployment) terminate() {
	if d.cmd == nil {
		return
	}
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(10 * time.Second):
			fmt.Fprintf(os.Stderr, "conformance: wb serve (%s) ignored SIGTERM for 10 s; killing it\n", d.name)
			_ = d.cmd.Process.Kill()
			<-d.exited
		}
	}
}

// restart replaces the server process with a fresh one (new data dir, port and keys).
func (d *deployment) restart() error {
	d.prevLog += d.stderrTail(300) + "\n----- restarted -----\n"
	d.stop()
	nd, err := startServer(d.bin, d.runtime, "--pool", "1", "--desktop-pool", "0", "--plugin-timeout", "1s")
	if err != nil {
		return err
	}
	d.url, d.apiKey, d.admin = nd.url, nd.apiKey, nd.admin
	d.tmp, d.cmd, d.exited = nd.tmp, nd.cmd, nd.exited
	go func() { <-nd.exited; d.waitErr = nd.waitErr }()
	d.mu.Lock()
	d.created = nil
	d.mu.Unlock()
	return nil
}

// mountedBelow reports whether anything is mounted under dir (then it is not removed).
func mountedBelow(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			return true
		}
	}
	return false
}

func (d *deployment) stderrTail(lines int) string {
	if d.tmp == "" {
		return ""
	}
	b, _ := os.ReadFile(filepath.Join(d.tmp, "stderr"))
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = append([]string{fmt.Sprintf("… (%d earlier lines)", len(ls)-lines)}, ls[len(ls)-lines:]...)
	}
	return strings.Join(ls, "\n")
}

// stderrLines returns the lines of wb serve's stderr that mention substr (a session id), so
// that a failure names what the server saw of it even where the whole log is cut.
func (d *deployment) stderrLines(substr string) string {
	if d.server != nil {
		return d.server.stderrLines(substr)
	}
	if d.tmp == "" {
		return "(not started by this test: no log)"
	}
	b, _ := os.ReadFile(filepath.Join(d.tmp, "stderr"))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return "(no line of its log names " + substr + ")"
	}
	return strings.Join(out, "\n")
}

func (d *deployment) printStderr() {
	if d.cmd == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "\n===== wb serve --runtime %s (%s) stderr =====\n%s\n===== end %s =====\n", d.runtime, d.url, d.prevLog+d.stderrTail(300), d.runtime)
}

func (d *deployment) track(id string) {
	d.mu.Lock()
	d.created = append(d.created, id)
	d.mu.Unlock()
}

func (d *deployment) tracked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.created...)
}

// forEach runs f as a parallel subtest per deployment.
func forEach(t *testing.T, f func(t *testing.T, d *deployment)) {
	if len(deployments) == 0 {
		t.Fatal("no deployment: TestMain did not run")
	}
	for _, d := range deployments {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

func bg(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// TestStderrLinesOfATenant: a tenant's view of a deployment finds the server's log lines of a
// session (a failure of the adversarial suite once printed nothing: its tenants had no log).
func TestStderrLinesOfATenant(t *testing.T) {
	srv := &deployment{tmp: t.TempDir()}
	log := "level=INFO msg=other\nlevel=WARN msg=\"guest crashed\" session=sess_x detail=...\n"
	if err := os.WriteFile(filepath.Join(srv.tmp, "stderr"), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	tenant := &deployment{server: srv}
	if got := tenant.stderrLines("sess_x"); !strings.Contains(got, "guest crashed") || strings.Contains(got, "other") {
		t.Errorf("a tenant's stderrLines = %q, want the server's one line of sess_x", got)
	}
	if got := tenant.stderrLines("sess_y"); !strings.Contains(got, "no line") {
		t.Errorf("stderrLines of an unknown session = %q, want it to say no line names it", got)
	}
}
