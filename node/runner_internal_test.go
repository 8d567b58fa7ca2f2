package node

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor/templates"
	"wb/store"
)

// TestPythonLoaderMatchesPlain: a run handed to a waiting python3 runner answers what
// `python3 -c CODE` answers (stdout, stderr, exit code) for what a run can do: print,
// fail, exit, read stdin, env and cwd, look at its globals and argv. The agent runs on this
// host, with the host's python3.
func TestPythonLoaderMatchesPlain(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on this host")
	}
	dir, err := os.MkdirTemp("", "wbr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.MkdirAll(filepath.Join(dir, "root", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Serve(ctx, agent.Config{Socket: filepath.Join(dir, "a.sock"), Root: filepath.Join(dir, "root")})
	}()
	t.Cleanup(func() { cancel(); <-done })
	c := agent.NewClient(filepath.Join(dir, "a.sock"))
	defer c.Close()
	hctx, hcancel := context.WithTimeout(ctx, 30*time.Second)
	defer hcancel()
	if err := waitHealthy(hctx, c); err != nil {
		t.Fatal(err)
	}
	tpl := templates.Template{Runtimes: []templates.Runtime{{Name: "python3", Argv: []string{py, "-c"}}}}
	req, ok := runnerRequest(tpl, "python3")
	if !ok {
		t.Fatal("python3 has no runner")
	}
	for _, tc := range []struct {
		name, code, stdin, cwd string
		env                    map[string]string
	}{
		{name: "print", code: "print(6*7)"},
		{name: "stderr and stdout", code: "import sys\nprint('out')\nprint('err', file=sys.stderr)\nprint('é✓')"},
		{name: "exception", code: "x = 1\n1/0"},
		{name: "nested exception", code: "def f():\n    raise ValueError('v')\ntry:\n    f()\nexcept ValueError as e:\n    raise KeyError('k') from e"},
		{name: "syntax error", code: "print(("},
		{name: "exit code", code: "import sys\nsys.exit(3)"},
		{name: "exit message", code: "raise SystemExit('bye')"},
		{name: "exit builtin", code: "exit(4)"},
		{name: "globals", code: "print(sorted(k for k in globals()))\nprint(__name__, __doc__, __spec__, __package__)"},
		{name: "argv and path", code: "import sys\nprint(sys.argv, sys.path[0])"},
		{name: "stdin", code: "import sys\nprint(repr(sys.stdin.read()))", stdin: "hello\nworld"},
		{name: "no stdin", code: "import sys\nprint(repr(sys.stdin.read()))"},
		{name: "env and cwd", code: "import os\nprint(os.environ['FOO'], os.environ.get('HOME'), os.getcwd().endswith('/root/sub'))",
			env: map[string]string{"FOO": "bar baz"}, cwd: "sub"},
		{name: "atexit", code: "import atexit\natexit.register(lambda: print('bye'))\nprint('hi')"},
		{name: "modules", code: "import sys\nprint('json' in sys.modules, 'traceback' in sys.modules)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ectx, ecancel := context.WithTimeout(ctx, time.Minute)
			defer ecancel()
			base := agent.ExecRequest{Argv: []string{py, "-c", tc.code}, Env: tc.env, Cwd: tc.cwd, Stdin: []byte(tc.stdin), TimeoutS: 30}
			want, err := c.Exec(ectx, base, nil)
			if err != nil {
				t.Fatal(err)
			}
			pid, err := c.StartRunner(ectx, req)
			if err != nil {
				t.Fatal(err)
			}
			run := base
			run.Runner = "python3"
			got, err := c.Exec(ectx, run, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Stdout != want.Stdout || got.Stderr != want.Stderr || got.ExitCode != want.ExitCode {
				t.Errorf("through the runner (pid %d): exit %d\nstdout %q\nstderr %q\nplain: exit %d\nstdout %q\nstderr %q",
					pid, got.ExitCode, got.Stdout, got.Stderr, want.ExitCode, want.Stdout, want.Stderr)
			}
		})
	}
}

// TestRunnerOf: only a runtime's argv plus the code goes to its runner, and not when the run
// sets what the interpreter reads as it starts.
func TestRunnerOf(t *testing.T) {
	tpl := templates.Template{Runtimes: []templates.Runtime{
		{Name: "sh", Argv: []string{"/bin/sh", "-c"}},
		{Name: "python3", Argv: []string{"/usr/bin/python3", "-c"}},
	}}
	for _, c := range []struct {
		argv []string
		env  map[string]string
		want string
	}{
		{[]string{"/usr/bin/python3", "-c", "print(1)"}, nil, "python3"},
		{[]string{"/usr/bin/python3", "-c", "print(1)"}, map[string]string{"FOO": "1"}, "python3"},
		{[]string{"/usr/bin/python3", "-c", "print(1)"}, map[string]string{"PYTHONPATH": "/x"}, ""},
		{[]string{"/usr/bin/python3", "-c", "print(1)"}, map[string]string{"LC_ALL": "C"}, ""},
		{[]string{"/usr/bin/python3", "-c", "print(1)", "arg"}, nil, ""},
		{[]string{"/usr/bin/python3", "script.py"}, nil, ""},
		{[]string{"python3", "-c", "print(1)"}, nil, ""},
		{[]string{"/bin/sh", "-c", "echo"}, nil, ""}, // sh has no runner
	} {
		if got := runnerOf(tpl, c.argv, c.env); got != c.want {
			t.Errorf("runnerOf(%q, %v) = %q, want %q", c.argv, c.env, got, c.want)
		}
	}
}

// TestPoolTarget: a runner pool holds its Size while nothing claims from it, and grows with
// the rate of claims of the last rateWindow (two boots' worth of claims), up to Max; a pool
// without Max stays at Size.
func TestPoolTarget(t *testing.T) {
	now := time.Now()
	w := Pool{Template: "t", SizeClass: "s", Size: 1, Max: 8, Runner: "python3"}
	p := &warmPool{demand: map[poolKey][]time.Time{}, bootTook: map[poolKey]time.Duration{w.key(): time.Second}}
	claims := func(n int, ago time.Duration) {
		p.demand[w.key()] = nil
		for range n {
			p.noteDemand(w.key(), now.Add(-ago))
		}
	}
	for _, c := range []struct {
		claims int
		ago    time.Duration
		pool   Pool
		want   int
	}{
		{0, 0, w, 1},
		{5, time.Second, w, 1},      // 0.5/s: one boot's claims fit in one guest
		{20, time.Second, w, 4},     // 2/s × 1 s boot × 2
		{100, time.Second, w, 8},    // capped at Max
		{100, 2 * rateWindow, w, 1}, // too long ago
		{100, time.Second, Pool{Template: "t", SizeClass: "s", Size: 2, Runner: "python3"}, 2}, // no Max
	} {
		claims(c.claims, c.ago)
		if got := p.target(c.pool, now); got != c.want {
			t.Errorf("%d claims %s ago, pool %+v: target %d, want %d", c.claims, c.ago, c.pool, got, c.want)
		}
	}
}

// TestPoolNextWithinCapacity: a pool grows past its Size only into the node's free capacity
// (its guests booting count against it), and boots at most what its target asks.
func TestPoolNextWithinCapacity(t *testing.T) {
	w := Pool{Template: "t", SizeClass: "s", Size: 1, Max: 8, Runner: "python3"}
	n := &Node{Config: Config{Info: store.NodeInfo{VCPU: 3, MemoryMiB: 1 << 20}, Pools: []Pool{w}}, guests: map[string]*live{}}
	p := newWarmPool(n)
	n.pool = p
	now := time.Now()
	for range 200 {
		p.noteDemand(w.key(), now)
	}
	booted := 0
	for range 10 {
		if _, ok := p.next(now); ok {
			booted++
		}
	}
	if booted != 3 {
		t.Errorf("the pool started %d boots on a node of 3 vCPUs; want 3", booted)
	}
	// Without claims it keeps its Size alone.
	p2 := newWarmPool(&Node{Config: Config{Info: store.NodeInfo{VCPU: 64, MemoryMiB: 1 << 20}, Pools: []Pool{w}}, guests: map[string]*live{}})
	booted = 0
	for range 10 {
		if _, ok := p2.next(now); ok {
			booted++
		}
	}
	if booted != 1 {
		t.Errorf("an idle pool of Size 1 started %d boots", booted)
	}
}
