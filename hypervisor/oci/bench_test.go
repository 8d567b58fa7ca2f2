package oci_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"wb/hypervisor"
	"wb/hypervisor/internal/guestfile"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/internal/proc"
	"wb/internal/wbbin"
)

// BenchmarkCreateBoot measures create + boot of a busybox guest until its init has written
// its ready file (stop and delete are outside the timer). Beside each runtime, in the same
// run, its baseline bare-RUNTIME: the runtime alone running `sh -c true` on the same root
// file system to its exit.
func BenchmarkCreateBoot(b *testing.B) {
	cat := catalog(b)
	for _, rt := range runtimes() {
		b.Run("bare-"+rt, func(b *testing.B) { bareRun(b, rt, cat[templates.Base].RootFS) })
		b.Run(rt, func(b *testing.B) {
			d := newDriver(b, rt)
			ctx := context.Background()
			for b.Loop() {
				b.StopTimer()
				s := guestSpec(b, cat[templates.Base], jobRunner)
				b.StartTimer()
				if err := d.Create(ctx, s); err != nil {
					b.Fatal(err)
				}
				if err := d.Boot(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				waitFile(b, filepath.Join(s.AgentDir, "ready"), 30*time.Second)
				b.StopTimer()
				if err := d.Stop(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				if err := d.Delete(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// bareRun times `RUNTIME run` of the runtime's own default spec (bareBundle) running
// `/bin/sh -c true`, to the process's exit; the runtime deletes the container on exit.
func bareRun(b *testing.B, rt, rootfs string) {
	bundle := bareBundle(b, rootfs, "true")
	global := bareGlobal(b, rt)
	ctx := b.Context()
	n := 0
	for b.Loop() {
		n++
		args := append(append([]string(nil), global...), "run", "--bundle", bundle, "bare"+strconv.Itoa(n))
		if out, err := exec.CommandContext(ctx, rt, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s run: %v: %s", rt, err, out)
		}
	}
}

// BenchmarkRunsPython/bare-RUNTIME is the ceiling of tier-1 python runs on this host, for
// the platform's RunsPython (conformance, 4 clients): 4 clients, each a loop of bare `RUNTIME run`s of
// tpl_dev_polyglot (its root file system and toolchain binds, read-only) running
// `python3 -c 'print(6*7)'` to its exit, where the runtime deletes the container. A run of
// the platform destroys its guest too, so its pool refills one guest per run, and its runs/s
// cannot pass this one's, whatever else it saves.
func BenchmarkRunsPython(b *testing.B) {
	cat := catalog(b)
	tpl := cat[templates.DevPolyglot]
	for _, rt := range runtimes() {
		b.Run("bare-"+rt, func(b *testing.B) {
			bundle := bareBundle(b, tpl.RootFS, "python3 -c 'print(6*7)'", tpl.Binds...)
			global := bareGlobal(b, rt)
			var next atomic.Int64
			busy := hostBusy(b)
			start := time.Now()
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						args := append(append([]string(nil), global...), "run", "--bundle", bundle, "py"+strconv.FormatInt(i, 10))
						out, err := exec.CommandContext(b.Context(), rt, args...).CombinedOutput()
						if err != nil || !strings.Contains(string(out), "42") {
							b.Errorf("%s run: %v: %s", rt, err, out)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "runs/s")
			// The host's CPU a run took, as the platform's runs report theirs (conformance
			// BenchmarkRunsPython): their ratio is what the platform adds to a run.
			b.ReportMetric(float64((hostBusy(b)-busy).Microseconds())/1000/float64(b.N), "host-cpu-ms")
		})
	}
}

// bareBundle writes a bundle of the runtime's own default spec (`runc spec`: its namespaces,
// no cgroup limits, no agent, no writable layer) with rootfs read-only, binds (read-only)
// and `/bin/sh -c script` as its process.
func bareBundle(b *testing.B, rootfs, script string, binds ...hypervisor.Bind) string {
	b.Helper()
	bundle := b.TempDir()
	if out, err := exec.Command("runc", "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v: %s", err, out)
	}
	cfgPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	var cfg specs.Spec
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatalf("runc spec's config.json: %v", err)
	}
	cfg.Root = &specs.Root{Path: rootfs, Readonly: true}
	cfg.Process.Terminal = false
	cfg.Process.Args = []string{"/bin/sh", "-c", script}
	for _, bd := range binds {
		cfg.Mounts = append(cfg.Mounts, specs.Mount{Destination: bd.Target, Type: "bind", Source: bd.Source,
			Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	if raw, err = json.Marshal(&cfg); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, raw, 0o600); err != nil {
		b.Fatal(err)
	}
	return bundle
}

// bareGlobal is the runtime's global flags for a bare container: a state root of its own,
// and for runsc the driver's default flags.
func bareGlobal(b *testing.B, rt string) []string {
	b.Helper()
	if _, err := exec.LookPath(rt); err != nil {
		b.Fatalf("%s is not installed: %v", rt, err)
	}
	global := []string{"--root", b.TempDir()}
	if rt == oci.RuntimeRunsc {
		global = append(global, oci.DefaultRunscFlags()...)
	}
	return global
}

// bareLoop is the bare containers' process: a shell that wakes every 100 ms, as the driver's
// benchmark guests do.
const bareLoop = "while :; do sleep 0.1; done"

// bareCmd runs one `RUNTIME GLOBAL... ARGS...` to its exit; the container's own output (it
// inherits the runtime's stdio on run and restore) goes to log, so that no pipe waits on it.
func bareCmd(b *testing.B, rt string, global []string, log *os.File, args ...string) {
	b.Helper()
	cmd := exec.CommandContext(b.Context(), rt, append(append([]string(nil), global...), args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		b.Fatalf("%s %s: %v (output in %s)", rt, strings.Join(args, " "), err, log.Name())
	}
}

// bareDetached starts a bare container (bareBundle with bareLoop) detached, under a fresh
// id, and force-deletes it when the benchmark ends. It answers the id, the global flags
// and the log of the runtime's and the container's output.
func bareDetached(b *testing.B, rt, rootfs string) (id, bundle string, global []string, log *os.File) {
	b.Helper()
	bundle = bareBundle(b, rootfs, bareLoop)
	global = bareGlobal(b, rt)
	log, err := os.Create(filepath.Join(b.TempDir(), "bare.log"))
	if err != nil {
		b.Fatal(err)
	}
	id = "bare" + randHex(b, 6)
	b.Cleanup(func() {
		// A paused runsc container must be thawed before delete (see Driver.Delete).
		_ = exec.Command(rt, append(append([]string(nil), global...), "resume", id)...).Run()
		if out, err := exec.Command(rt, append(append([]string(nil), global...), "delete", "--force", id)...).CombinedOutput(); err != nil {
			b.Logf("%s delete --force %s: %v: %s", rt, id, err, out)
		}
		_ = log.Close()
	})
	bareCmd(b, rt, global, log, "run", "--detach", "--bundle", bundle, id)
	return id, bundle, global, log
}

// imageBytes is the size of a runsc checkpoint image dir, which must hold one.
func imageBytes(b *testing.B, dir string) int64 {
	b.Helper()
	n := guestfile.DiskUsage(dir)
	if n == 0 {
		b.Fatalf("no checkpoint image in %s", dir)
	}
	return n
}

// timed runs f and appends its duration to *ds.
func timed(ds *[]time.Duration, f func()) {
	t0 := time.Now()
	f()
	*ds = append(*ds, time.Since(t0))
}

// reportPct reports the 50th and 99th percentiles of ds, in ms, as PREFIX-p50-ms and
// PREFIX-p99-ms.
func reportPct(b *testing.B, prefix string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	for _, p := range []int{50, 99} {
		i := min(max((p*len(s)+99)/100-1, 0), len(s)-1)
		b.ReportMetric(float64(s[i].Microseconds())/1000, fmt.Sprintf("%s-p%d-ms", prefix, p))
	}
}

// BenchmarkPauseResume measures one pause + resume round trip of a running guest, and
// pause-… and resume-… each. Beside each runtime, in the same run, its baseline
// bare-RUNTIME: `RUNTIME pause` + `RUNTIME resume` of a bare container (bareDetached) on the
// same root file system.
func BenchmarkPauseResume(b *testing.B) {
	cat := catalog(b)
	for _, rt := range runtimes() {
		b.Run("bare-"+rt, func(b *testing.B) {
			id, _, global, log := bareDetached(b, rt, cat[templates.Base].RootFS)
			var pause, resume []time.Duration
			for b.Loop() {
				timed(&pause, func() { bareCmd(b, rt, global, log, "pause", id) })
				timed(&resume, func() { bareCmd(b, rt, global, log, "resume", id) })
			}
			reportPct(b, "pause", pause)
			reportPct(b, "resume", resume)
		})
		b.Run(rt, func(b *testing.B) {
			d := newDriver(b, rt)
			ctx := context.Background()
			s := guestSpec(b, cat[templates.Base], jobRunner)
			boot(b, d, s)
			var pause, resume []time.Duration
			for b.Loop() {
				timed(&pause, func() {
					if err := d.Pause(ctx, s.ID); err != nil {
						b.Fatal(err)
					}
				})
				timed(&resume, func() {
					if err := d.Resume(ctx, s.ID); err != nil {
						b.Fatal(err)
					}
				})
			}
			reportPct(b, "pause", pause)
			reportPct(b, "resume", resume)
		})
	}
}

// BenchmarkCheckpointRestore measures the runsc "live snapshot": a memory snapshot (which
// stops the guest), delete, and a memory restore under the same id, with each step's
// percentiles. Beside it, in the same run, its baseline bare-runsc: `runsc checkpoint
// --image-path`, `runsc delete` and `runsc restore --detach` of a bare container
// (bareDetached) on the same root file system, and checkpoint-and-restore, the two without
// the delete (what a session's memory snapshot waits for: node deletes the old guest in the
// background).
func BenchmarkCheckpointRestore(b *testing.B) {
	cat := catalog(b)
	b.Run("bare-runsc", func(b *testing.B) {
		rt := oci.RuntimeRunsc
		id, bundle, global, log := bareDetached(b, rt, cat[templates.Base].RootFS)
		dirs := b.TempDir()
		var ckpt, del, restore, both []time.Duration
		var image int64
		n := 0
		for b.Loop() {
			n++
			img := filepath.Join(dirs, "img"+strconv.Itoa(n))
			timed(&ckpt, func() { bareCmd(b, rt, global, log, "checkpoint", "--image-path", img, id) })
			image += imageBytes(b, img)
			timed(&del, func() { bareCmd(b, rt, global, log, "delete", id) })
			timed(&restore, func() {
				bareCmd(b, rt, global, log, "restore", "--image-path", img, "--detach", "--bundle", bundle, id)
			})
			b.StopTimer()
			both = append(both, ckpt[len(ckpt)-1]+restore[len(restore)-1])
			if err := os.RemoveAll(filepath.Join(dirs, "img"+strconv.Itoa(n-1))); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(image)/float64(n)/1e6, "image-MB")
		reportPct(b, "checkpoint", ckpt)
		reportPct(b, "delete", del)
		reportPct(b, "restore", restore)
		reportPct(b, "checkpoint-and-restore", both)
	})
	b.Run("runsc", func(b *testing.B) {
		d := newDriver(b, oci.RuntimeRunsc)
		ctx := context.Background()
		s := guestSpec(b, cat[templates.Base], `echo ready > /run/wb/ready; i=0; while :; do i=$((i+1)); echo $i > /workspace/count; sleep 0.1; done`)
		boot(b, d, s)
		dirs := b.TempDir()
		var snapshot, del, restore []time.Duration
		var image int64
		n := 0
		for b.Loop() {
			n++
			snap := filepath.Join(dirs, "snap"+strconv.Itoa(n))
			timed(&snapshot, func() {
				si, err := d.Snapshot(ctx, s.ID, snap, true)
				if err != nil {
					b.Fatal(err)
				}
				if !si.Memory {
					b.Fatal("no memory snapshot")
				}
			})
			image += imageBytes(b, filepath.Join(snap, "memory")) // the driver's runsc image dir
			timed(&del, func() {
				if err := d.Delete(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
			})
			s.Writable = filepath.Join(dirs, "w"+strconv.Itoa(n))
			timed(&restore, func() {
				if err := d.Restore(ctx, s, snap); err != nil {
					b.Fatal(err)
				}
			})
		}
		b.ReportMetric(float64(image)/float64(n)/1e6, "image-MB")
		reportPct(b, "snapshot", snapshot)
		reportPct(b, "delete", del)
		reportPct(b, "restore", restore)
	})
}

// BenchmarkIdleGuest measures what an idle runsc guest costs its host: the CPU of its sandbox
// and gofer over idleWindow, in % of one core (cpu-%core), for a guest running the agent as a
// node starts it (a process limit, so the agent's fork-bomb guard is armed), beside
// bare-runsc: a bare container on the same root file system running sleep, in the same run.
// Under gVisor's ptrace platform each system call of the guest costs the host a few context
// switches: an agent that wakes often shows here.
func BenchmarkIdleGuest(b *testing.B) {
	const settle, idleWindow = 3 * time.Second, 10 * time.Second
	cat := catalog(b)
	rt := oci.RuntimeRunsc
	measure := func(b *testing.B, id string) {
		time.Sleep(settle)
		pids := hostPidsWhere(func(cmdline string) bool { return strings.Contains(cmdline, id) })
		if len(pids) == 0 {
			b.Fatalf("no host process names guest %s", id)
		}
		before := make([]int64, len(pids))
		for i, pid := range pids {
			before[i] = cpuTicks(b, pid)
		}
		time.Sleep(idleWindow)
		var ticks int64
		for i, pid := range pids {
			ticks += cpuTicks(b, pid) - before[i]
		}
		for b.Loop() { // the figure is the window's; ResetTimer, which b.Loop calls, drops metrics
		}
		// USER_HZ is 100 on Linux: a tick is 10 ms.
		b.ReportMetric(float64(ticks)*float64(10*time.Millisecond)/float64(idleWindow)*100, "cpu-%core")
	}
	b.Run("bare-"+rt, func(b *testing.B) {
		bundle := bareBundle(b, cat[templates.Base].RootFS, "sleep 3600")
		global := bareGlobal(b, rt)
		log, err := os.Create(filepath.Join(b.TempDir(), "bare.log"))
		if err != nil {
			b.Fatal(err)
		}
		id := "bare" + randHex(b, 6)
		b.Cleanup(func() {
			_ = exec.Command(rt, append(slices.Clone(global), "delete", "--force", id)...).Run()
			_ = log.Close()
		})
		bareCmd(b, rt, global, log, "run", "--detach", "--bundle", bundle, id)
		measure(b, id)
	})
	b.Run(rt, func(b *testing.B) {
		d := newDriver(b, rt)
		s := guestSpec(b, cat[templates.Base], "")
		agent, err := wbbin.Agent(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		s.AgentBin = agent
		s.Args = []string{hypervisor.GuestAgentBin, "agent", "--socket", hypervisor.GuestAgentDir + "/agent.sock", "--root", hypervisor.GuestWorkspace}
		track(b, d, s)
		ctx := ctxT(b, 3*time.Minute)
		if err := d.Create(ctx, s); err != nil {
			b.Fatal(err)
		}
		if err := d.Boot(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(s.AgentDir, "agent.sock")); err == nil {
				break
			} else if time.Now().After(deadline) {
				b.Fatalf("the agent did not listen within 2 minutes: %v", err)
			}
		}
		measure(b, s.ID)
	})
}

// cpuTicks is the user and system CPU of process pid so far, in ticks.
func cpuTicks(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0 // gone: its ticks are no longer counted
	}
	// The command name may hold spaces: fields start after its closing parenthesis.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return utime + stime
}

// BenchmarkGuestStartCPU measures the host CPU one runsc guest costs: its cgroup's (sandbox
// and gofer) from `runsc run --detach` until its process is ready (ready-cpu-ms) and until it
// is deleted (total-cpu-ms), the runtime commands' own (the driver's children:
// runsc-cli-cpu-ms), and the two together (total-with-cli-cpu-ms). Three processes on the
// same root file system and mounts: agent, wb's agent as a node starts it; listener, a static
// Go program that only listens on the agent's socket; true, /bin/true (ready when the
// driver's Launch returns). The cgroup is read through the driver's cgroup parent, whose
// cpuacct usage keeps its removed children's (cgroup v1; skipped elsewhere). Beside them,
// bare-true: a bare `runsc run` (bareBundle) of `sh -c true` on the same root file system,
// whose CPU is the runsc CLI's with its sandbox's and gofer's (it waits for them).
func BenchmarkGuestStartCPU(b *testing.B) {
	cat := catalog(b)
	agentBin, err := wbbin.Agent(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	listener := buildListener(b)
	agentArgs := []string{hypervisor.GuestAgentBin, "agent", "--socket", hypervisor.GuestAgentDir + "/agent.sock", "--root", hypervisor.GuestWorkspace}
	b.Run("bare-true", func(b *testing.B) {
		// The runsc CLI waits for the sandbox and gofer it started: their CPU is its children's.
		bundle := bareBundle(b, cat[templates.Base].RootFS, "true")
		reportMedian(b, "total-with-cli-cpu-ms", bareRunsCPU(b, bareGlobal(b, oci.RuntimeRunsc), bundle))
	})
	for _, v := range []struct {
		name, bin string
		args      []string
	}{
		{"agent", agentBin, agentArgs},
		{"listener", listener, agentArgs},
		{"true", "", []string{"/bin/true"}},
	} {
		b.Run(v.name, func(b *testing.B) {
			cgParent := "/wbtest-" + randHex(b, 4)
			d := newDriver(b, oci.RuntimeRunsc, func(o *oci.Options) { o.CgroupParent = cgParent })
			usage := cpuacctUsage(b, cgParent)
			ctx := context.Background()
			var ready, total, cli, all []time.Duration
			for b.Loop() {
				b.StopTimer()
				s := guestSpec(b, cat[templates.Base], "")
				s.AgentBin, s.Args = v.bin, v.args
				if err := os.MkdirAll(s.AgentDir, 0o755); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { // a guest a failed iteration leaves
					_ = d.Stop(ctx, s.ID)
					_ = d.Delete(ctx, s.ID)
				})
				b.StartTimer()
				u0, c0 := usage(), childrenCPU(b)
				if err := d.Launch(ctx, s); err != nil {
					b.Fatal(err)
				}
				for deadline := time.Now().Add(2 * time.Minute); v.bin != ""; time.Sleep(2 * time.Millisecond) {
					if _, err := os.Stat(filepath.Join(s.AgentDir, "agent.sock")); err == nil {
						break
					} else if time.Now().After(deadline) {
						b.Fatalf("no socket within 2 minutes: %v", err)
					}
				}
				ready = append(ready, usage()-u0)
				if err := d.Stop(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				if err := d.Delete(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
				total = append(total, usage()-u0)
				cli = append(cli, childrenCPU(b)-c0)
				all = append(all, total[len(total)-1]+cli[len(cli)-1])
			}
			reportMedian(b, "ready-cpu-ms", ready)
			reportMedian(b, "total-cpu-ms", total)
			reportMedian(b, "runsc-cli-cpu-ms", cli)
			reportMedian(b, "total-with-cli-cpu-ms", all)
		})
	}
}

// hostBusy is how long the host's CPUs have been busy since boot (proc.HostBusy).
func hostBusy(b *testing.B) time.Duration {
	d, err := proc.HostBusy()
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// childrenCPU is the user and system CPU of this process's waited-for descendants so far.
func childrenCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportMedian reports the median of ds, in ms, as unit.
func reportMedian(b *testing.B, unit string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000, unit)
}

// buildListener builds a static Go program that listens on the Unix socket of its --socket
// flag and serves nothing: the least a Go agent does before it answers.
func buildListener(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	src := `package main

import (
	"flag"
	"net"
	"os"
)

func main() {
	socket := flag.String("socket", "", "")
	flag.String("root", "", "")
	_ = flag.CommandLine.Parse(os.Args[2:])
	_ = os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
	if err != nil {
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		c.Close()
	}
}
`
	for name, text := range map[string]string{"main.go": src, "go.mod": "module listener\n\ngo 1.22\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "listener")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build listener: %v: %s", err, out)
	}
	return bin
}

// cpuacctUsage makes cgroup parent's cgroup v1 cpuacct dir (skipping b where there is none)
// and answers a reader of its CPU usage. The parent is made before the first guest, so that
// its usage is there to read before the guest's create (the driver removes it at the end).
func cpuacctUsage(b *testing.B, parent string) func() time.Duration {
	b.Helper()
	dir := filepath.Join("/sys/fs/cgroup/cpuacct", parent)
	if err := os.Mkdir(dir, 0o755); err != nil {
		b.Skipf("no cgroup v1 cpuacct hierarchy here: %v", err)
	}
	return func() time.Duration {
		n, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
		if err != nil {
			b.Fatal(err)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(n)), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(v)
	}
}

// bareRunsCPU runs bundle with `runsc run` (global flags first) once per b.Loop and answers
// the CPU of each run: the runsc CLI's children's (it waits for the sandbox and gofer it
// started).
func bareRunsCPU(b *testing.B, global []string, bundle string) []time.Duration {
	var total []time.Duration
	n := 0
	for b.Loop() {
		n++
		c0 := childrenCPU(b)
		args := append(slices.Clone(global), "run", "--bundle", bundle, "bare"+strconv.Itoa(n))
		if out, err := exec.Command(oci.RuntimeRunsc, args...).CombinedOutput(); err != nil {
			b.Fatalf("runsc run: %v: %s", err, out)
		}
		total = append(total, childrenCPU(b)-c0)
	}
	return total
}
