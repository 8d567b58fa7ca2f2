package oci_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/wbbin"
)

// BenchmarkRunnerGuestCPU splits the host CPU of one warm tier-1 python guest on runsc, as a
// node's pool makes it (tpl_dev_polyglot, its agent with the pool's limits, the python3
// runner started through the agent), from `runsc create` to the runner ready: the sandbox
// cgroup's CPU (sandbox and gofer) during `runsc create` (boot-cpu-ms), from `runsc start`
// to the agent's first answer (agent-cpu-ms: the container's start in the sandbox and the
// agent's), and the runner's start through the agent (runner-cpu-ms); the runsc commands'
// own CPU (cli-cpu-ms) and the guest's stop and delete (teardown-cpu-ms) beside them.
// Medians, the spread as -min and -max. Beside it, bare: a bare `runsc run` of the same root
// file system and binds running `python3 -c pass`, and bare-true running `true`: the CLI's CPU
// with its sandbox's and gofer's (it waits for them).
//
// For comparisons in one run (CPU, not wall: other work on the host shows less in it):
// WB_BENCH_AGENTS alternates agents guest by guest, each reported under its index:
// comma-separated, each a binary's path and optionally "|" and environment entries for it,
// space-separated (default: the built agent). WB_BENCH_RUNNER=sh starts a shell as the runner
// (the agent's part of a runner's start); WB_BENCH_SOCKET_ONLY waits for the socket only and
// starts no runner (an agent that only listens); WB_BENCH_RUNNER_DELAY (durations, one per
// agent) waits before the runner's start; WB_BENCH_BARE adds bare scripts (";"-separated);
// WB_BENCH_RUNSC_FLAGS adds runsc flags (e.g. --strace --debug --debug-log=DIR/).
func BenchmarkRunnerGuestCPU(b *testing.B) {
	tpl, py := polyglotPython(b)
	var bins []string
	if v := os.Getenv("WB_BENCH_AGENTS"); v != "" {
		bins = strings.Split(v, ",")
	} else {
		bin, err := wbbin.Agent(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		bins = []string{bin}
	}
	bares := []struct{ name, script string }{{"bare", "python3 -c pass"}, {"bare-true", "true"}}
	for i, sc := range strings.Split(os.Getenv("WB_BENCH_BARE"), ";") {
		if sc != "" {
			bares = append(bares, struct{ name, script string }{fmt.Sprintf("bare-%d", i), sc})
		}
	}
	for _, bare := range bares {
		b.Run(bare.name, func(b *testing.B) {
			bundle := bareBundle(b, tpl.RootFS, bare.script, tpl.Binds...)
			global := append(bareGlobal(b, oci.RuntimeRunsc), strings.Fields(os.Getenv("WB_BENCH_RUNSC_FLAGS"))...)
			reportSpread(b, "total-with-cli-cpu-ms", bareRunsCPU(b, global, bundle))
		})
	}
	loader := benchLoader
	socketOnly := os.Getenv("WB_BENCH_SOCKET_ONLY") != ""
	if os.Getenv("WB_BENCH_RUNNER") == "sh" {
		py, loader = []string{"/bin/sh", "-c"}, "echo r >&4; exec 4>&-; cat <&3 >/dev/null"
	}
	b.Run("agent", func(b *testing.B) {
		cgParent := "/wbtest-" + randHex(b, 4)
		d := newDriver(b, oci.RuntimeRunsc, func(o *oci.Options) {
			o.CgroupParent = cgParent
			if f := os.Getenv("WB_BENCH_RUNSC_FLAGS"); f != "" {
				o.RunscFlags = append(oci.DefaultRunscFlags(), strings.Fields(f)...)
			}
		})
		usage := cpuacctUsage(b, cgParent)
		ctx := context.Background()
		figs := make([]map[string][]time.Duration, len(bins))
		for k := range figs {
			figs[k] = map[string][]time.Duration{}
		}
		n := 0
		for b.Loop() {
			k := n % len(bins)
			n++
			s := guestSpec(b, tpl, "")
			bin, env, _ := strings.Cut(bins[k], "|")
			s.AgentBin, s.AgentSocket = bin, "agent.sock"
			s.Env = append(slices.Clone(s.Env), strings.Fields(env)...)
			s.Args = []string{hypervisor.GuestAgentBin, "agent", "--socket", hypervisor.GuestAgentDir + "/agent.sock", "--root", hypervisor.GuestWorkspace}
			benchGuest(ctx, b, d, &s)
			u0, c0 := usage(), childrenCPU(b)
			if err := d.Create(ctx, s); err != nil {
				b.Fatal(err)
			}
			u1 := usage()
			if err := d.Boot(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			c := agent.NewClient(filepath.Join(s.AgentDir, "agent.sock"))
			for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(2 * time.Millisecond) {
				_, err := os.Stat(filepath.Join(s.AgentDir, "agent.sock"))
				if err == nil && !socketOnly {
					err = c.Health(ctx)
				}
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("no agent within 2 minutes: %v", err)
				}
			}
			if d, err := time.ParseDuration(nth(os.Getenv("WB_BENCH_RUNNER_DELAY"), k)); err == nil {
				time.Sleep(d)
			}
			u2 := usage()
			if !socketOnly {
				if _, err := c.StartRunner(ctx, agent.RunnerRequest{Name: "python3", Argv: py, Loader: loader}); err != nil {
					b.Fatal(err)
				}
			}
			u3, c3 := usage(), childrenCPU(b)
			c.Close()
			if err := d.Stop(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			if err := d.Delete(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			f := figs[k]
			f["boot"] = append(f["boot"], u1-u0)
			f["agent"] = append(f["agent"], u2-u1)
			f["runner"] = append(f["runner"], u3-u2)
			f["ready"] = append(f["ready"], u3-u0)
			f["cli"] = append(f["cli"], c3-c0)
			f["teardown"] = append(f["teardown"], usage()-u3)
		}
		for k, f := range figs {
			for _, name := range []string{"boot", "agent", "runner", "ready", "cli", "teardown"} {
				reportSpread(b, fmt.Sprintf("%d-%s-cpu-ms", k, name), f[name])
			}
		}
	})
}

// benchLoader is node's python loader (node.pythonLoader) in short: it says it is ready on
// fd 4 and reads its frame from fd 3, importing nothing python's start did not.
const benchLoader = `import os
os.write(4, b"r")
os.close(4)
while os.read(3, 65536):
    pass
`

// reportSpread reports the median, least and most of ds, in ms, as unit, unit-min, unit-max.
func reportSpread(b *testing.B, unit string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(s[len(s)/2]), unit)
	b.ReportMetric(ms(s[0]), unit+"-min")
	b.ReportMetric(ms(s[len(s)-1]), unit+"-max")
	b.ReportMetric(float64(len(s)), unit+"-n")
}

// nth is the k-th of list's comma-separated items, its last where it has fewer.
func nth(list string, k int) string {
	items := strings.Split(list, ",")
	return items[min(k, len(items)-1)]
}

// BenchmarkDirectGuestCPU is BenchmarkRunnerGuestCPU for a direct guest (LaunchDirect: no
// agent; its init python3 with benchDirectLoader, node's directLoader in short), with its
// one exec: the sandbox cgroup's CPU from the launch to the loader ready (ready-cpu-ms), the
// exec of print(6*7) to its status (exec-cpu-ms), the stop and delete (teardown-cpu-ms), and
// the runsc commands' own (cli-cpu-ms); their sum, total-cpu-ms, is a warm run's whole guest.
// Beside it, bare: a bare `runsc run` of the same root file system running python3 -c pass.
func BenchmarkDirectGuestCPU(b *testing.B) {
	tpl, py := polyglotPython(b)
	b.Run("bare", func(b *testing.B) {
		bundle := bareBundle(b, tpl.RootFS, "python3 -c pass", tpl.Binds...)
		reportSpread(b, "total-with-cli-cpu-ms", bareRunsCPU(b, bareGlobal(b, oci.RuntimeRunsc), bundle))
	})
	b.Run("direct", func(b *testing.B) {
		cgParent := "/wbtest-" + randHex(b, 4)
		d := newDriver(b, oci.RuntimeRunsc, func(o *oci.Options) { o.CgroupParent = cgParent })
		usage := cpuacctUsage(b, cgParent)
		ctx := context.Background()
		figs := map[string][]time.Duration{}
		for b.Loop() {
			s := guestSpec(b, tpl, "")
			s.Args = append(slices.Clone(py), benchDirectLoader)
			benchGuest(ctx, b, d, &s)
			dg, err := agent.NewDirectGuest("/workspace", s.Env, func() { _ = d.Stop(ctx, s.ID) })
			if err != nil {
				b.Fatal(err)
			}
			u0, c0 := usage(), childrenCPU(b)
			err = d.LaunchDirect(ctx, s, dg.GuestStdio())
			dg.ReleaseGuestStdio()
			if err != nil {
				b.Fatal(err)
			}
			if err := dg.WaitReady(ctx); err != nil {
				b.Fatal(err)
			}
			u1 := usage()
			res, err := dg.Exec(ctx, agent.ExecRequest{Argv: append(slices.Clone(py), "print(6*7)")}, false, 0, nil)
			if err != nil || res.Stdout != "42\n" || res.ExitCode != 0 {
				b.Fatalf("exec: %+v %v", res, err)
			}
			u2 := usage()
			dg.Close()
			if err := d.Stop(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			if err := d.Delete(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			u3, c3 := usage(), childrenCPU(b)
			figs["ready"] = append(figs["ready"], u1-u0)
			figs["exec"] = append(figs["exec"], u2-u1)
			figs["teardown"] = append(figs["teardown"], u3-u2)
			figs["cli"] = append(figs["cli"], c3-c0)
			figs["total"] = append(figs["total"], u3-u0+c3-c0)
		}
		for _, name := range []string{"ready", "exec", "teardown", "cli", "total"} {
			reportSpread(b, name+"-cpu-ms", figs[name])
		}
	})
}

// benchGuest readies s for the guest CPU benchmarks: a guest's usual pids and memory, its
// agent dir made, and its stop and delete when b ends (should it fail before its own).
func benchGuest(ctx context.Context, b *testing.B, d *oci.Driver, s *hypervisor.Spec) {
	s.Pids, s.MemoryMiB = 1024, 512
	if err := os.MkdirAll(s.AgentDir, 0o755); err != nil {
		b.Fatal(err)
	}
	id := s.ID
	b.Cleanup(func() {
		_ = d.Stop(ctx, id)
		_ = d.Delete(ctx, id)
	})
}

// benchDirectLoader is node's directLoader in short: ready on stdin, the frame's code run, its
// status said on stdin.
const benchDirectLoader = `import os, sys
os.write(0, b"r")
def take(k):
    b = b""
    while len(b) < k:
        c = os.read(0, k - len(b))
        if not c:
            os._exit(0)
        b += c
    return b
frame = take(int.from_bytes(take(8), "big"))
exec(frame.partition(b"\0\0")[2].decode())
sys.stdout.flush()
os.write(0, b"x0\n")
`

// polyglotPython answers tpl_dev_polyglot and python3's argv there, skipping b without it.
func polyglotPython(b *testing.B) (templates.Template, []string) {
	tpl := catalog(b)[templates.DevPolyglot]
	i := slices.IndexFunc(tpl.Runtimes, func(r templates.Runtime) bool { return r.Name == "python3" })
	if i < 0 {
		b.Skip("no python3 in tpl_dev_polyglot here")
	}
	return tpl, tpl.Runtimes[i].Argv
}
