package node_test

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/templates"
	"wb/node"
	"wb/session"
)

// processAge prints how long ago the process running it started, in seconds, by the guest's
// own clock (/proc/self/stat's start time against /proc/uptime).
const processAge = `import os
st = open('/proc/self/stat').read().rsplit(')', 1)[1].split()
up = float(open('/proc/uptime').read().split()[0])
print(round(up - int(st[19]) / os.sysconf('SC_CLK_TCK'), 3))
`

// TestRunnerPool: a run's session claims a guest of the runner pool, and its code runs in the
// interpreter started before the run (its process is older than the wait before the exec);
// the run's globals die with its guest, the pool refills, and a run past its timeout is
// killed there.
func TestRunnerPool(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			// The template a python3 run uses, as the run pools pick it.
			pools := node.RunnerPools(catalog, 1, 1)
			if len(pools) == 0 || pools[0].Runner != "python3" {
				t.Fatalf("no python3 run pool on this host: %+v", pools)
			}
			tpl := catalog[pools[0].Template]
			i := slices.IndexFunc(tpl.Runtimes, func(r templates.Runtime) bool { return r.Name == "python3" })
			argv := tpl.Runtimes[i].Argv
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
