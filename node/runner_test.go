package node_test

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/templates"
	"wb/node"
	"wb/node/client"
	"wb/session"
)

// processAge prints how long ago the process running it started, in seconds, by the guest's
// own clock (/proc/self/stat's start time against /proc/uptime).
const processAge = `import os
st = open('/proc/self/stat').read().rsplit(')', 1)[1].split()
up = float(open('/proc/uptime').read().split()[0])
print(round(up - int(st[19]) / os.sysconf('SC_CLK_TCK'), 3))
`

// pythonRunPools answers the run pools of this host's catalog (one guest each), the template
// a python3 run uses, as the run pools pick it, and python3's argv there.
func pythonRunPools(t *testing.T) ([]node.Pool, templates.Template, []string) {
	t.Helper()
	pools := node.RunnerPools(catalog, 1, 1)
	if len(pools) == 0 || pools[0].Runner != "python3" {
		t.Fatalf("no python3 run pool on this host: %+v", pools)
	}
	tpl := catalog[pools[0].Template]
	i := slices.IndexFunc(tpl.Runtimes, func(r templates.Runtime) bool { return r.Name == "python3" })
	return pools, tpl, tpl.Runtimes[i].Argv
}

// TestRunnerPool: a run's session claims a guest of the runner pool, and its code runs in the
// interpreter started before the run (its process is older than the wait before the exec);
// the run's globals die with its guest, the pool refills, and a run past its timeout is
// killed there.
func TestRunnerPool(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			pools, tpl, argv := pythonRunPools(t)
			st, _ := newStore(t)
			d := newDriver(t, rt, tempDir(t))
			cfg := nodeConfig(t, st, d, tempDir(t), "node_runner_"+rt)
			cfg.Pools = pools
			n := startNode(t, cfg)
			awaitRunnerPool := func() {
				t.Helper()
				deadline := time.Now().Add(3 * time.Minute)
				for n.RunnerPoolReady(tpl.Name, "s", "python3") < 1 {
					if time.Now().After(deadline) {
						t.Fatal("the runner pool never filled")
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			run := func(code string, timeoutS int) session.ExecResult {
				t.Helper()
				s := provision(t, st, n.Node, "proj_run_"+rt, sessionOpts{tier: 1, template: tpl.Name + "@" + tpl.Digest, res: sizeS(), idleS: 600, lifeS: 600,
					meta: map[string]string{session.RunMetadataKey: "python3"}})
				cmd, _ := json.Marshal(append(slices.Clone(argv), code))
				req := session.ExecRequest{Command: cmd}
				if timeoutS > 0 {
					req.TimeoutS = &timeoutS
				}
				res, err := n.Exec(ctxT(t, 2*time.Minute), s, req, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				reason := session.Deleted
				s.StateReason = &reason
				s.State = session.Stopping
				if err := n.Stop(ctxT(t, time.Minute), s); err != nil {
					t.Fatal(err)
				}
				return res
			}

			awaitRunnerPool()
			const aged = 1500 * time.Millisecond
			time.Sleep(aged)
			res := run(processAge+"leak = 1\n", 0)
			age, err := strconv.ParseFloat(strings.TrimSpace(res.Stdout), 64)
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("the run answered %+v", res)
			}
			// A python3 started for the run would be a few milliseconds old, however loaded the
			// machine: this one waited through the sleep.
			if age < 1.0 {
				t.Fatalf("the run's process is %.3f s old; the pool's interpreter waited %s before it", age, aged)
			}

			awaitRunnerPool() // refilled after the claim
			res = run("print('leak' in globals(), 6*7)", 0)
			if res.Stdout != "False 42\n" || res.ExitCode != 0 {
				t.Fatalf("the second run answered %+v; want a fresh interpreter", res)
			}

			awaitRunnerPool()
			start := time.Now()
			res = run("import time\nprint('up', flush=True)\ntime.sleep(120)", 1)
			if !res.TimedOut || res.Stdout != "up\n" {
				t.Fatalf("a run past its timeout answered %+v", res)
			}
			if el := time.Since(start); el > time.Minute {
				t.Fatalf("a run with timeout 1 s took %s", el)
			}
		})
	}
}

// TestRunsUseThePolyglotTemplate: a one-shot run of each of the host's toolchains, and its
// warm run pool, use tpl_dev_polyglot, never tpl_desktop (which sorts before it, and whose
// guests carry the desktop's binds: runs there took twice as long to refill).
func TestRunsUseThePolyglotTemplate(t *testing.T) {
	if _, ok := catalog[templates.Desktop]; !ok {
		t.Fatalf("no %s in the catalog: install the desktop's packages (scripts/deps.sh)", templates.Desktop)
	}
	cat := node.CatalogOf(catalog)
	pools := node.RunnerPools(catalog, 1, 1)
	if len(pools) == 0 {
		t.Fatal("no run pools on this host")
	}
	for _, p := range pools {
		if p.Template != templates.DevPolyglot {
			t.Errorf("the %s run pool is on %s", p.Runner, p.Template)
		}
		tpl, _, err := cat.Runtime(p.Runner)
		if err != nil || tpl.Name != templates.DevPolyglot {
			t.Errorf("a %s run goes to %s (%v)", p.Runner, tpl.Name, err)
		}
	}
	// A run may name python3 by its version: the catalog carries the host's.
	if _, py, err := cat.Runtime("python3"); err != nil || py.Version == "" {
		t.Errorf("python3 in the catalog: %+v, %v; want its version", py, err)
	} else if tpl, rt, err := cat.Runtime("python" + py.Version); err != nil || rt.Name != "python3" || tpl.Name != templates.DevPolyglot {
		t.Errorf("a run of python%s goes to %s %s (%v)", py.Version, tpl.Name, rt.Name, err)
	}
}

// TestDirectRunPool: on runsc a run's session claims a direct guest: its code runs as the
// guest's init (pid 1, no agent beside it), through the node in process and through its API
// alike, with its stdin, environment and exit code; a command that is not the runtime's runs
// in a child; the guest takes one exec and refuses a second, files and PTYs (409); and its
// init's end with the run is no crash: the session runs on until its run stops it.
func TestDirectRunPool(t *testing.T) {
	t.Parallel()
	pools, tpl, argv := pythonRunPools(t)
	st, _ := newStore(t)
	d := newDriver(t, "runsc", tempDir(t))
	cfg := nodeConfig(t, st, d, tempDir(t), "node_direct")
	cfg.Pools = pools
	checker := &fakeChecker{kill: "xmrig"}
	cfg.Runtime = checker
	srv := httptest.NewUnstartedServer(nil)
	cfg.Info.Addr = "http://" + srv.Listener.Addr().String()
	n := startNode(t, cfg)
	srv.Config.Handler = n.Handler("tok_direct")
	srv.Start()
	t.Cleanup(srv.Close)
	c := client.New(st, "tok_direct")
	const project = "proj_direct"
	claim := func() *session.Session {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for n.RunnerPoolReady(tpl.Name, "s", "python3") < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the runner pool never filled")
			}
			time.Sleep(20 * time.Millisecond)
		}
		return provision(t, st, n.Node, project, sessionOpts{tier: 1, template: tpl.Name + "@" + tpl.Digest, res: sizeS(), idleS: 600, lifeS: 600,
			meta: map[string]string{session.RunMetadataKey: "python3"}})
	}
	execReq := func(cmd []string, stdin string, env map[string]string) session.ExecRequest {
		raw, _ := json.Marshal(cmd)
		return session.ExecRequest{Command: raw, Stdin: stdin, Env: env}
	}
	const probe = `import os, sys
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
init = open('/proc/1/cmdline', 'rb').read().split(b'\0')[0].decode()
print(os.getpid(), pids, os.path.basename(init), os.environ.get('RUN'), sys.stdin.read())
sys.exit(7)
`
	for _, via := range []string{"process", "api"} {
		t.Run(via, func(t *testing.T) {
			s := claim()
			exec := n.Exec
			if via == "api" {
				exec = c.Exec
			}
			res, err := exec(ctxT(t, 2*time.Minute), s, execReq(append(slices.Clone(argv), probe), "in", map[string]string{"RUN": "r1"}), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Through an agent the code would be its child: pid 2 or more, the agent pid 1.
			if want := "1 [1] python3 r1 in\n"; res.Stdout != want || res.ExitCode != 7 {
				t.Errorf("the run answered exit %d, stdout %q, stderr %q; want 7, %q", res.ExitCode, res.Stdout, res.Stderr, want)
			}
			_, err = exec(ctxT(t, time.Minute), s, execReq(append(slices.Clone(argv), "print(1)"), "", nil), nil, nil)
			if err == nil || !strings.Contains(err.Error(), "tier-1 run") {
				t.Errorf("a second exec in the run's guest: %v; want it refused", err)
			}
			if _, err := n.Agent(ctxT(t, time.Minute), s); err == nil || !strings.Contains(err.Error(), "tier-1 run") {
				t.Errorf("the agent of a direct guest (files, PTY): %v; want it refused", err)
			}
			// The init ended with the run: the session runs on until its run stops it.
			time.Sleep(3 * time.Second)
			if got := get(t, st, project, s.ID); got.State != session.Running {
				t.Fatalf("after its run the session is %s (%s); want running until its run stops it", got.State, reasonOf(got))
			}
			reason := session.Deleted
			s.StateReason, s.State = &reason, session.Stopping
			if err := n.Stop(ctxT(t, time.Minute), s); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A process the run starts is seen, by its name (the runtime's process table: no agent
	// reads its command line), and a rule on it ends the session.
	t.Run("process_start", func(t *testing.T) {
		s := claim()
		// The name is made in the guest: the exec's own argv names no miner.
		const code = "import os, shutil, time\nm = '/tmp/xm' + 'rig'\nos.symlink(shutil.which('sleep'), m)\nos.spawnv(os.P_NOWAIT, m, [m, '60'])\ntime.sleep(60)"
		res, err := n.Exec(ctxT(t, 2*time.Minute), s, execReq(append(slices.Clone(argv), code), "", nil), nil, nil)
		got, _ := waitState(t, st, project, s.ID, time.Minute, session.Failed, session.Stopped)
		if got.State != session.Failed || got.Rule == nil || *got.Rule != "no_xmrig" {
			t.Errorf("a run that started xmrig: %s (%s), exec %+v, %v; want failed by no_xmrig", got.State, reasonOf(got), res, err)
		}
	})
	t.Run("command", func(t *testing.T) {
		s := claim()
		res, err := n.Exec(ctxT(t, 2*time.Minute), s, execReq([]string{"/bin/sh", "-c", "echo $X; exit 4"}, "", map[string]string{"X": "sh"}), nil, nil)
		if err != nil || res.Stdout != "sh\n" || res.ExitCode != 4 {
			t.Errorf("a shell in a direct guest: %+v, %v; want exit 4, \"sh\\n\"", res, err)
		}
	})
}
