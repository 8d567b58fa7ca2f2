package oci_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
)

// TestGuestLifecycle boots a busybox guest on each runtime and checks isolation, pause and
// resume, stats, the exit event, and that stop + delete leave nothing behind.
func TestGuestLifecycle(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			ctx := ctxT(t, 10*time.Minute) // the whole test's steps: generous for a cold, busy machine
			s := guestSpec(t, cat[templates.Base], jobRunner)
			g, create, start, ready := boot(t, d, s)
			t.Logf("%s: create %s, boot %s, create→ready %s", rt, ms(create), ms(start), ms(ready))

			info, err := d.Info(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if info.State != hypervisor.StateRunning || info.Pid <= 0 {
				t.Fatalf("info after boot = %+v, want running with a pid", info)
			}
			knownRunning(t, d, s.ID, "after boot", true, true)
			knownRunning(t, d, "wp-unknown", "of a guest it never made", false, false)

			// The template root is read-only; the writable dirs are not, and land on the host.
			out := g.mustRun(`if echo x > /rootfile 2>/dev/null; then echo ROOT-WRITABLE; else echo root-denied; fi
if echo x > /bin/x 2>/dev/null; then echo BIN-WRITABLE; else echo bin-denied; fi
echo hello > /workspace/hello.txt && echo tmp > /tmp/t.txt && echo home > /root/r.txt && echo ws-ok`)
			for _, want := range []string{"root-denied", "bin-denied", "ws-ok"} {
				if !strings.Contains(out, want) {
					t.Fatalf("write checks: %q lacks %q", out, want)
				}
			}
			if b, err := os.ReadFile(filepath.Join(hypervisor.WorkspaceDir(s.Writable), "hello.txt")); err != nil || string(b) != "hello\n" {
				t.Fatalf("host view of /workspace/hello.txt: %q, %v", b, err)
			}
			for _, p := range []string{"tmp/t.txt", "root/r.txt"} {
				if _, err := os.Stat(filepath.Join(s.Writable, p)); err != nil {
					t.Fatalf("host view of writable %s: %v", p, err)
				}
			}
			if _, err := os.Lstat(filepath.Join(s.RootFS, "rootfile")); err == nil {
				t.Fatal("guest wrote into the template rootfs")
			}

			// Own pid namespace: only the guest's few processes.
			out = g.mustRun(`ls /proc | grep -c '^[0-9][0-9]*$'; ps`)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			n, err := strconv.Atoi(lines[0])
			if err != nil {
				t.Fatalf("proc count: %q", out)
			}
			if n < 2 || n > 10 {
				t.Fatalf("guest sees %d processes in /proc, want only its own few:\n%s", n, out)
			}
			if exe, _ := os.Executable(); strings.Contains(out, filepath.Base(exe)) {
				t.Fatalf("guest sees the host's test process:\n%s", out)
			}
			t.Logf("%s: guest /proc shows %d processes", rt, n)

			// The guest has a working loopback of its own ...
			// (Retried, not slept on: a loaded host may start the listener late.)
			// Each attempt has a fresh listener on a port of its own: CI once saw one attempt's
			// connection succeed and its listener write nothing.
			out = g.mustRun(`for p in 7771 7772 7773 7774 7775; do (nc -l -p $p > /tmp/lo.$p &) ; ` +
				`for i in $(seq 50); do echo over-lo | nc -w 2 127.0.0.1 $p && break; sleep 0.1; done; ` +
				`for i in $(seq 30); do grep -q over-lo /tmp/lo.$p && break; sleep 0.1; done; grep -q over-lo /tmp/lo.$p && break; done; cat /tmp/lo.*`)
			if !strings.Contains(out, "over-lo") {
				t.Fatalf("guest loopback does not work: %q", out)
			}
			// ... but the host's loopback is out of reach.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var accepted atomic.Int64
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					accepted.Add(1)
					_, _ = c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost-secret\n"))
					c.Close()
				}
			}()
			port := ln.Addr().(*net.TCPAddr).Port
			if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err != nil {
				t.Fatalf("host cannot reach its own server: %v", err)
			} else {
				c.Close()
			}
			g.mustRun(`nc -w 2 127.0.0.1 ` + strconv.Itoa(port) + ` </dev/null > /workspace/nc.out 2>&1; echo "nc=$?" > /workspace/net.txt
wget -q -T 2 -O - http://127.0.0.1:` + strconv.Itoa(port) + `/ >> /workspace/nc.out 2>&1; echo "wget=$?" >> /workspace/net.txt`)
			// nc decides; busybox-static's wget (1.35) segfaults on a refused connection (exit
			// 139, on the host too), so its result only has to be a failure.
			ws := hypervisor.WorkspaceDir(s.Writable)
			netRes, _ := os.ReadFile(filepath.Join(ws, "net.txt"))
			ncOut, _ := os.ReadFile(filepath.Join(ws, "nc.out"))
			t.Logf("%s: guest → host 127.0.0.1:%d: %s (%s)", rt, port, strings.ReplaceAll(strings.TrimSpace(string(netRes)), "\n", " "), strings.TrimSpace(string(ncOut)))
			if accepted.Load() != 1 || strings.Contains(string(ncOut), "host-secret") ||
				!strings.Contains(string(netRes), "nc=") || strings.Contains(string(netRes), "nc=0") || strings.Contains(string(netRes), "wget=0") {
				t.Fatalf("guest reached the host's loopback: accepted=%d (1 is the host's own probe), result %q, output %q", accepted.Load(), netRes, ncOut)
			}

			// Pause and resume.
			t0 := time.Now()
			if err := d.Pause(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			pause := time.Since(t0)
			if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StatePaused {
				t.Fatalf("info after pause = %+v, %v", info, err)
			}
			knownRunning(t, d, s.ID, "after pause", false, true)
			t0 = time.Now()
			if err := d.Resume(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			resume := time.Since(t0)
			if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
				t.Fatalf("info after resume = %+v, %v", info, err)
			}
			knownRunning(t, d, s.ID, "after resume", true, true)
			g.mustRun("true")
			t.Logf("%s: pause %s, resume %s", rt, ms(pause), ms(resume))

			// Stats from the cgroup.
			var st hypervisor.Stats
			deadline := time.Now().Add(10 * time.Second)
			for {
				if st, err = d.Stats(ctx, s.ID); err != nil {
					t.Fatal(err)
				}
				if st.CPUMs > 0 && st.MemoryBytes > 0 || time.Now().After(deadline) {
					break
				}
				g.mustRun("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
			}
			t.Logf("%s: stats %+v", rt, st)
			if st.CPUMs <= 0 || st.MemoryBytes <= 0 {
				t.Fatalf("stats = %+v, want cpu and memory > 0", st)
			}

			// Stop → exit event; delete leaves nothing.
			events, err := d.Events(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			t0 = time.Now()
			if err := d.Stop(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			stop := time.Since(t0)
			select {
			case ev, ok := <-events:
				if !ok || ev.Type != hypervisor.EventExit {
					t.Fatalf("event after stop = %+v (open %v), want exit", ev, ok)
				}
				// The operator's log learns what the guest's cgroup counted and its last words.
				if !strings.Contains(ev.Detail, "pids.max=") || !strings.Contains(ev.Detail, "console tail:") {
					t.Errorf("exit event detail = %q, want the cgroup's pids counters and the console's tail", ev.Detail)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no exit event within 10s of stop")
			}
			if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateStopped {
				t.Fatalf("info after stop = %+v, %v", info, err)
			}
			knownRunning(t, d, s.ID, "after stop", false, true)
			t0 = time.Now()
			if err := d.Delete(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: stop %s, delete %s", rt, ms(stop), ms(time.Since(t0)))
			ids, err := d.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(ids, s.ID) {
				t.Fatalf("%s list still has %s after delete", rt, s.ID)
			}
			if _, err := os.Stat(d.BundleDir(s.ID)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("bundle dir still there after delete: %v", err)
			}
			if _, err := d.Info(ctx, s.ID); !errors.Is(err, hypervisor.ErrNotFound) {
				t.Fatalf("info after delete: %v, want ErrNotFound", err)
			}
			if err := d.Delete(ctx, s.ID); err != nil {
				t.Fatalf("second delete: %v", err)
			}
		})
	}
}

// TestOOM runs a guest past its 64 MiB limit and expects the OOM kill to show in Events and
// Stats. Under runc the kernel kills the biggest guest process; under runsc the sandbox
// itself is the process the kernel kills, so the guest stops.
func TestOOM(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			ctx := ctxT(t, 10*time.Minute) // the whole test's steps: generous for a cold, busy machine
			s := guestSpec(t, cat[templates.Base], `echo ready > /run/wb/ready; sleep 1; awk 'BEGIN { s = "a"; for (i = 0; i < 28; i++) s = s s; print length(s) }' > /workspace/survived; while :; do sleep 1; done`)
			s.MemoryMiB = 64
			track(t, d, s)
			if err := d.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			events, err := d.Events(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			if err := d.Boot(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			timeout := time.After(60 * time.Second)
			var got []string
		wait:
			for {
				select {
				case ev, ok := <-events:
					if !ok {
						break wait
					}
					got = append(got, ev.Type)
					if ev.Type == hypervisor.EventOOM {
						break wait
					}
				case <-timeout:
					t.Fatalf("no oom event within 60s (events so far %v)", got)
				}
			}
			if !slices.Contains(got, hypervisor.EventOOM) {
				t.Fatalf("events %v, want oom", got)
			}
			t.Logf("%s: oom event %s after boot (events %v)", rt, ms(time.Since(t0)), got)
			st, err := d.Stats(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if st.OOMKills < 1 {
				t.Fatalf("stats after oom = %+v, want OOMKills ≥ 1", st)
			}
			// The node reads the count alone around every exec: for a guest this driver
			// created, without its record (hidden here).
			rec := filepath.Join(d.BundleDir(s.ID), "wb-guest.json")
			if err := os.Rename(rec, rec+".hidden"); err != nil {
				t.Fatal(err)
			}
			k, err := d.OOMKills(ctx, s.ID)
			if err := os.Rename(rec+".hidden", rec); err != nil {
				t.Fatal(err)
			}
			if err != nil || k != st.OOMKills {
				t.Fatalf("OOMKills = %d, %v; want %d as Stats says", k, err, st.OOMKills)
			}
			if _, err := d.OOMKills(ctx, "wb-no-such-guest"); err == nil {
				t.Error("OOMKills of a guest that does not exist answered no error")
			}
			if b, err := os.ReadFile(filepath.Join(hypervisor.WorkspaceDir(s.Writable), "survived")); err == nil && len(b) > 0 {
				t.Fatalf("the allocation succeeded past the memory limit: %s", b)
			}
			info, _ := d.Info(ctx, s.ID)
			t.Logf("%s: stats %+v, state after oom %s", rt, st, info.State)
		})
	}
}

// TestSnapshotDiskOnly snapshots the writable layer of a running guest and restores it into a
// new guest; on runc a memory snapshot request degrades to disk-only and says so.
func TestSnapshotDiskOnly(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			ctx := ctxT(t, 10*time.Minute) // the whole test's steps: generous for a cold, busy machine
			s := guestSpec(t, cat[templates.Base], jobRunner)
			g, _, _, _ := boot(t, d, s)
			g.mustRun(`mkdir -p /workspace/src && echo 'print("hi")' > /workspace/src/main.py && chmod 600 /workspace/src/main.py && ln -s src/main.py /workspace/link && echo secret > /root/.token && echo scratch > /tmp/s`)

			dir := filepath.Join(t.TempDir(), "snap")
			t0 := time.Now()
			si, err := d.Snapshot(ctx, s.ID, dir, rt == "runc") // runc: ask for memory, expect disk-only
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(t0)
			if si.Memory || si.SizeBytes <= 0 {
				t.Fatalf("snapshot info %+v, want disk-only with a size", si)
			}
			if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
				t.Fatalf("guest after a disk snapshot: %+v, %v (want running)", info, err)
			}
			g.mustRun("echo after > /workspace/after.txt") // not in the snapshot

			r := guestSpec(t, cat[templates.Base], jobRunner)
			rg := track(t, d, r)
			t0 = time.Now()
			if err := d.Restore(ctx, r, dir); err != nil {
				t.Fatal(err)
			}
			restore := time.Since(t0)
			waitFile(t, filepath.Join(r.AgentDir, "ready"), 30*time.Second)
			t.Logf("%s: disk snapshot %s (%d bytes), restore→boot %s, restore→ready %s", rt, ms(took), si.SizeBytes, ms(restore), ms(time.Since(t0)))
			out := rg.mustRun(`cat /workspace/src/main.py /workspace/link /root/.token /tmp/s; stat -c %a /workspace/src/main.py; ls /workspace`)
			for _, want := range []string{`print("hi")`, "secret", "scratch", "600"} {
				if !strings.Contains(out, want) {
					t.Fatalf("restored guest: %q lacks %q", out, want)
				}
			}
			if strings.Contains(out, "after.txt") {
				t.Fatalf("restored guest has a file written after the snapshot: %q", out)
			}
			if fi, err := os.Lstat(filepath.Join(hypervisor.WorkspaceDir(r.Writable), "link")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Fatalf("symlink not restored: %v", err)
			}
			// A restore into a non-empty writable layer is refused.
			r2 := r
			r2.ID = "t" + randHex(t, 6)
			if err := d.Restore(ctx, r2, dir); err == nil {
				t.Fatal("restore into a non-empty writable layer succeeded")
			}
		})
	}
}

// TestBusyFreezerIsRetried: runc's cgroup v1 freezer gives up ("unable to freeze") when a
// loaded host's guest keeps forking; Pause and a disk snapshot, which freezes the guest to
// copy its layer, both try again. runc here is a wrapper that fails its first pause as the
// real one did in a cold make test.
func TestBusyFreezerIsRetried(t *testing.T) {
	real, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal("runc is not installed: apt-get install -y runc")
	}
	dir := t.TempDir()
	failed := filepath.Join(dir, "failed-once")
	wrapper := filepath.Join(dir, "runc")
	script := `#!/bin/sh
for a in "$@"; do
	if [ "$a" = pause ] && [ ! -e ` + shQuote(failed) + ` ]; then
		: > ` + shQuote(failed) + `
		echo 'time="2026-12-02T13:19:12Z" level=error msg="unable to freeze"' >&2
		exit 1
	fi
done
exec ` + shQuote(real) + ` "$@"
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	d := newDriver(t, oci.RuntimeRunc, func(o *oci.Options) { o.RuntimePath = wrapper })
	ctx := ctxT(t, 5*time.Minute)
	s := guestSpec(t, catalog(t)[templates.Base], jobRunner)
	boot(t, d, s)

	if err := d.Pause(ctx, s.ID); err != nil {
		t.Fatalf("pause after one busy freeze: %v", err)
	}
	if _, err := os.Stat(failed); err != nil {
		t.Fatalf("the wrapper never failed a pause: %v", err)
	}
	if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StatePaused {
		t.Fatalf("guest after pause: %+v, %v (want paused)", info, err)
	}
	if err := d.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(failed); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Snapshot(ctx, s.ID, filepath.Join(t.TempDir(), "snap"), false); err != nil {
		t.Fatalf("disk snapshot after one busy freeze: %v", err)
	}
	if _, err := os.Stat(failed); err != nil {
		t.Fatalf("the wrapper never failed the snapshot's pause: %v", err)
	}
	if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("guest after a disk snapshot: %+v, %v (want running)", info, err)
	}
}

// TestSnapshotMemoryRunsc checkpoints a runsc guest whose shell keeps a counter in memory and
// restores it into a new guest: the counter goes on from where it was.
func TestSnapshotMemoryRunsc(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, "runsc")
	ctx := ctxT(t, 10*time.Minute) // the whole test's steps: generous for a cold, busy machine
	s := guestSpec(t, cat[templates.Base], `echo ready > /run/wb/ready; i=0; while :; do i=$((i+1)); echo $i > /workspace/count; sleep 0.1; done`)
	boot(t, d, s)
	count := filepath.Join(hypervisor.WorkspaceDir(s.Writable), "count")
	deadline := time.Now().Add(30 * time.Second)
	for readInt(t, count) < 20 {
		if time.Now().After(deadline) {
			t.Fatal("counter did not reach 20")
		}
		time.Sleep(50 * time.Millisecond)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	t0 := time.Now()
	si, err := d.Snapshot(ctx, s.ID, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	checkpoint := time.Since(t0)
	if !si.Memory {
		t.Fatalf("runsc snapshot info %+v, want memory", si)
	}
	if info, err := d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateStopped {
		t.Fatalf("guest after checkpoint: %+v, %v (want stopped)", info, err)
	}
	at := readInt(t, count)
	time.Sleep(300 * time.Millisecond) // the point: 3 of the counter's ticks, had it kept running
	if now := readInt(t, count); now != at {
		t.Fatalf("counter moved after the checkpoint (%d → %d)", at, now)
	}

	r := guestSpec(t, cat[templates.Base], "exit 1") // args are not used by a memory restore
	track(t, d, r)
	t0 = time.Now()
	if err := d.Restore(ctx, r, dir); err != nil {
		t.Fatal(err)
	}
	restore := time.Since(t0)
	if info, err := d.Info(ctx, r.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("restored guest: %+v, %v (want running)", info, err)
	}
	rcount := filepath.Join(hypervisor.WorkspaceDir(r.Writable), "count")
	var seen []int
	deadline = time.Now().Add(20 * time.Second)
	for len(seen) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("restored counter did not advance: %v", seen)
		}
		if v := readInt(t, rcount); v > 0 && v != at && (len(seen) == 0 || v != seen[len(seen)-1]) {
			seen = append(seen, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if seen[0] <= at || !slices.IsSorted(seen) {
		t.Fatalf("counter after restore %v, want it to go on from %d", seen, at)
	}
	t.Logf("runsc: checkpoint %s (%d bytes with layer), restore %s; counter %d → %v", ms(checkpoint), si.SizeBytes, ms(restore), at, seen)

	// The "live snapshot" pattern: checkpoint the restored guest and restore it under the
	// same id after deleting the stopped one.
	dir2 := filepath.Join(t.TempDir(), "snap2")
	if _, err := d.Snapshot(ctx, r.ID, dir2, true); err != nil {
		t.Fatal(err)
	}
	at2 := readInt(t, rcount)
	if err := d.Delete(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	r.Writable = filepath.Join(t.TempDir(), "writable")
	if err := d.Restore(ctx, r, dir2); err != nil {
		t.Fatal(err)
	}
	rcount = filepath.Join(hypervisor.WorkspaceDir(r.Writable), "count")
	deadline = time.Now().Add(20 * time.Second)
	for {
		if v := readInt(t, rcount); v > at2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("same-id restore: counter stuck at %d", readInt(t, rcount))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The node's live snapshot: the new guest takes over the checkpointed one's disk.
	dir3 := filepath.Join(t.TempDir(), "snap3")
	if _, err := d.Snapshot(ctx, r.ID, dir3, true); err != nil {
		t.Fatal(err)
	}
	at3 := readInt(t, rcount)
	// Written after the snapshot: only a guest that took over the layer (not one that
	// unpacked the snapshot's copy) sees it.
	if err := os.WriteFile(filepath.Join(hypervisor.WorkspaceDir(r.Writable), "after"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := guestSpec(t, cat[templates.Base], "exit 1")
	track(t, d, a)
	if err := d.RestoreAdopting(ctx, a, dir3, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(hypervisor.WorkspaceDir(a.Writable), "after")); err != nil {
		t.Fatalf("adopting restore: the old layer's file is not there: %v", err)
	}
	if _, err := os.Stat(a.Writable + ".img"); err != nil {
		t.Fatalf("adopting restore: the disk image is not the new guest's: %v", err)
	}
	if mountOptions(t, r.Writable) != "" {
		t.Fatal("adopting restore: the old layer is still mounted")
	}
	if o := mountOptions(t, a.Writable); !strings.Contains(o, "nodev") || !strings.Contains(o, "nosuid") {
		t.Fatalf("adopted layer mounted with %q, want nodev and nosuid kept", o)
	}
	if err := d.Delete(ctx, r.ID); err != nil { // the old guest goes; the new one runs on
		t.Fatal(err)
	}
	acount := filepath.Join(hypervisor.WorkspaceDir(a.Writable), "count")
	deadline = time.Now().Add(20 * time.Second)
	for readInt(t, acount) <= at3+2 {
		if time.Now().After(deadline) {
			t.Fatalf("adopting restore: counter stuck at %d (snapshot at %d)", readInt(t, acount), at3)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := d.Stop(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if mountOptions(t, a.Writable) != "" {
		t.Fatal("the adopted layer is still mounted after its guest was deleted")
	}
	if _, err := os.Stat(a.Writable + ".img"); !os.IsNotExist(err) {
		t.Fatalf("the adopted disk image was left behind: %v", err)
	}
}

// mountOptions is the per-mount options of the mount at dir ("" when dir is not a mount point).
func mountOptions(t testing.TB, dir string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) > 5 && f[4] == filepath.Clean(dir) {
			return f[5]
		}
	}
	return ""
}

// TestPolyglot runs the host's toolchains inside tpl_dev_polyglot.
func TestPolyglot(t *testing.T) {
	cat := catalog(t)
	tpl := cat[templates.DevPolyglot]
	var py []string
	for _, r := range tpl.Runtimes {
		if r.Name == "python3" {
			py = r.Argv
		}
	}
	if py == nil {
		t.Skip("python3 is not installed on this host (apt-get install python3); tpl_dev_polyglot has no python3 runtime")
	}
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			s := guestSpec(t, tpl, jobRunner)
			g, _, _, ready := boot(t, d, s)
			t.Logf("%s: polyglot create→ready %s, binds %v", rt, ms(ready), tpl.Binds)
			out := g.mustRun(shJoin(append(py, "print(6*7)")))
			if strings.TrimSpace(out) != "42" {
				t.Fatalf("python3 printed %q, want 42", out)
			}
			for _, r := range tpl.Runtimes {
				var script string
				switch r.Name {
				case "node":
					script = shJoin(append(r.Argv, "console.log(6*7)"))
				case "gcc": // the runtime compiles the C program and runs it
					script = shJoin(append(r.Argv, "int main(){return 42;}")) + `; echo "exit=$?"`
				default:
					continue
				}
				rc, out := g.run(script)
				t.Logf("%s: %s → exit %d: %s", rt, r.Name, rc, strings.TrimSpace(out))
				if rc != 0 || r.Name == "node" && strings.TrimSpace(out) != "42" || r.Name == "gcc" && !strings.Contains(out, "exit=42") {
					t.Errorf("%s does not run in %s: exit %d: %s", r.Name, templates.DevPolyglot, rc, out)
				}
			}
		})
	}
}

// TestPausedGuest stops one paused guest and deletes another without stopping it, and (runsc)
// takes a memory snapshot of a paused guest: runsc refuses or panics on these unless the
// driver thaws the guest first.
func TestPausedGuest(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			ctx := ctxT(t, 10*time.Minute) // the whole test's steps: generous for a cold, busy machine
			a := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, a)
			if err := d.Pause(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
			if err := d.Stop(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
			if info, err := d.Info(ctx, a.ID); err != nil || info.State != hypervisor.StateStopped {
				t.Fatalf("stop of a paused guest: %+v, %v", info, err)
			}

			b := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, b)
			if err := d.Pause(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
			if err := d.Delete(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
			if ids, err := d.List(ctx); err != nil || slices.Contains(ids, b.ID) {
				t.Fatalf("list after deleting a paused guest: %v, %v", ids, err)
			}

			c := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, c)
			if err := d.Pause(ctx, c.ID); err != nil {
				t.Fatal(err)
			}
			si, err := d.Snapshot(ctx, c.ID, filepath.Join(t.TempDir(), "snap"), true)
			if err != nil {
				t.Fatal(err)
			}
			info, err := d.Info(ctx, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			want := hypervisor.StatePaused // runc: disk-only, the guest stays as it was
			if rt == "runsc" {
				want = hypervisor.StateStopped
			}
			if si.Memory != (rt == "runsc") || info.State != want {
				t.Fatalf("snapshot of a paused guest: %+v, state %s (want %s)", si, info.State, want)
			}
		})
	}
}

// TestDiskLimit: the writable layer holds DiskGiB and no more; past it the guest gets ENOSPC,
// and deleting the guest leaves no mount or image behind.
func TestDiskLimit(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt)
			s := guestSpec(t, cat[templates.Base], jobRunner)
			s.DiskGiB = 1
			g, _, _, _ := boot(t, d, s)
			if out := g.mustRun(`head -c 100000000 /dev/zero > /workspace/ok && echo fine`); !strings.Contains(out, "fine") {
				t.Fatalf("100 MB within a 1 GiB disk: %q", out)
			}
			// fallocate takes 800 MB of the disk without writing it (writing 1.2 GB through
			// runsc's gofer took minutes on a loaded machine); the 300 MB written after must stop
			// at what is left. busybox reports ENOSPC as an I/O error; what matters is that the
			// write stops.
			code, out := g.run(`fallocate -l 800000000 /workspace/fill && echo allocated; head -c 300000000 /dev/zero > /workspace/big; echo "exit $?"; stat -c %s /workspace/big`)
			lines := strings.Fields(out)
			size, _ := strconv.ParseInt(lines[len(lines)-1], 10, 64)
			if code != 0 || !strings.Contains(out, "allocated") || !strings.Contains(out, "exit 1") || size <= 0 || size >= 300000000 {
				t.Fatalf("0.9 GB taken, then 300 MB on a 1 GiB disk: code %d, %q (want the write to stop at the limit)", code, out)
			}
			t.Logf("the write stopped at %d MB of 300", size/1000000)
			if err := d.Stop(ctxT(t, time.Minute), s.ID); err != nil {
				t.Fatal(err)
			}
			if err := d.Delete(ctxT(t, time.Minute), s.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(s.Writable + ".img"); !os.IsNotExist(err) {
				t.Fatalf("disk image left behind: %v", err)
			}
			mounts, _ := os.ReadFile("/proc/self/mountinfo")
			if strings.Contains(string(mounts), s.Writable) {
				t.Fatal("writable layer still mounted")
			}
		})
	}
}

// knownRunning checks what the driver knows of guest id without asking the runtime.
func knownRunning(t *testing.T, d *oci.Driver, id, when string, running, known bool) {
	t.Helper()
	if r, k := d.KnownRunning(id); r != running || k != known {
		t.Fatalf("KnownRunning %s = %v, %v; want %v, %v", when, r, k, running, known)
	}
}

// TestCreateCutOffLeavesNothing: a create whose context ends while the runtime is still
// creating (a warm-pool boot when its node stops) leaves no guest process, runtime state or
// cgroup behind. runsc killed in the middle of its create once left a sandbox running that
// its state did not know, so that no delete could find it.
func TestCreateCutOffLeavesNothing(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := newDriver(t, rt) // its cleanup fails the test if a guest's cgroup is left
			for _, after := range []time.Duration{5, 20, 40, 80, 150} {
				after *= time.Millisecond
				s := guestSpec(t, cat[templates.Base], jobRunner)
				ctx, cancel := context.WithTimeout(context.Background(), after)
				err := d.Create(ctx, s)
				cancel()
				if err == nil {
					track(t, d, s) // the create beat the cut
					continue
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Logf("create cut off after %v: %v", after, err)
				}
				ids, lerr := d.List(ctxT(t, time.Minute))
				if lerr != nil {
					t.Fatal(lerr)
				}
				if slices.Contains(ids, s.ID) {
					t.Errorf("create cut off after %v: the runtime still lists %s", after, s.ID)
				}
				if procs := processesNaming(s.ID); len(procs) > 0 {
					t.Errorf("create cut off after %v: processes of %s still run: %q", after, s.ID, procs)
				}
			}
		})
	}
}

// processesNaming answers the command lines of the host's processes that name id.
func processesNaming(id string) []string {
	var out []string
	dirs, _ := os.ReadDir("/proc")
	for _, de := range dirs {
		if _, err := strconv.Atoi(de.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), id) {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestConsoleBounded: guest root writing to its init's stdio, the host's console log of the
// guest (runsc lets it reopen /proc/1/fd/N, the host file itself; runc's user namespace does
// not), stops at the console's 4 MiB instead of filling the host's disk; the guest goes on,
// and its delete leaves no mount. The job runner, the test's init, keeps the console at fd 10
// while a job's output is redirected; the job writes 64 MiB to each of its fds that is the
// console (runc names the file, runsc a host file).
func TestConsoleBounded(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			d, s, g := bootJobRunner(t, rt, cat, nil)
			out := g.mustRun(`n=0; for f in /proc/1/fd/*; do case $(readlink $f) in *console.log|host:*) n=$((n+1)); head -c 67108864 /dev/zero >> $f 2>/dev/null; echo "$f: exit $?";; esac; done; echo "consoles $n"`)
			if !strings.Contains(out, "consoles ") || strings.Contains(out, "consoles 0") {
				t.Fatalf("found no console among the init's fds: %q", out)
			}
			st, err := os.Stat(d.ConsoleLog(s.ID))
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() > 4<<20 {
				t.Errorf("the console log is %d bytes after the guest wrote 64 MiB to it; want at most 4 MiB (%s)", st.Size(), out)
			}
			t.Logf("console log %d bytes; %s", st.Size(), strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
			if out := g.mustRun("echo alive"); !strings.Contains(out, "alive") {
				t.Fatalf("a job after: %q", out)
			}
			if err := d.Stop(ctxT(t, time.Minute), s.ID); err != nil {
				t.Fatal(err)
			}
			if err := d.Delete(ctxT(t, time.Minute), s.ID); err != nil {
				t.Fatal(err)
			}
			if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), d.BundleDir(s.ID)) {
				t.Fatal("the console's tmpfs is still mounted after the delete")
			}
		})
	}
}

// TestSnapshotSparseRefused: a guest's sparse file of 8 GiB on its 1 GiB disk makes its
// snapshot fail at once, saying why, instead of writing 8 GiB of zeros to the host's disk; the
// guest runs on (under runsc also after a refused snapshot with memory, refused before its
// checkpoint), and a snapshot without the file succeeds.
func TestSnapshotSparseRefused(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			d, s, g := bootJobRunner(t, rt, cat, func(s *hypervisor.Spec) { s.DiskGiB = 1 })
			g.mustRun(`truncate -s 8G /workspace/sparse && echo made`)
			dir := t.TempDir()
			if rt == oci.RuntimeRunsc {
				// With memory, the checkpoint would stop the guest: the refusal comes first.
				if _, err := d.Snapshot(ctxT(t, time.Minute), s.ID, filepath.Join(dir, "mem"), true); err == nil || !strings.Contains(err.Error(), "sparse") {
					t.Fatalf("snapshot with memory: %v; want it refused, naming sparse files", err)
				}
				if out := g.mustRun("echo alive"); !strings.Contains(out, "alive") {
					t.Fatalf("a job after the refused snapshot with memory: %q", out)
				}
			}
			start := time.Now()
			_, err := d.Snapshot(ctxT(t, time.Minute), s.ID, filepath.Join(dir, "snap"), false)
			if !errors.Is(err, hypervisor.ErrLayerTooLarge) || !strings.Contains(err.Error(), "sparse") {
				t.Fatalf("snapshot with an 8 GiB sparse file on a 1 GiB disk: %v; want it refused, naming sparse files", err)
			}
			if fi, err := os.Stat(filepath.Join(dir, "snap", "writable.tar")); err == nil && fi.Size() > 1<<30 {
				t.Errorf("the refused snapshot wrote %d bytes", fi.Size())
			}
			t.Logf("refused in %s: %v", time.Since(start).Round(time.Millisecond), err)
			g.mustRun(`rm /workspace/sparse`)
			if _, err := d.Snapshot(ctxT(t, time.Minute), s.ID, filepath.Join(dir, "snap2"), false); err != nil {
				t.Fatalf("snapshot without the file: %v", err)
			}
			if out := g.mustRun("echo alive"); !strings.Contains(out, "alive") {
				t.Fatalf("a job after: %q", out)
			}
		})
	}
}

// bootJobRunner boots a guest of the base template on a new driver of runtime rt, with the
// job runner as its init and edit (if any) applied to its spec.
func bootJobRunner(t *testing.T, rt string, cat templates.Catalog, edit func(*hypervisor.Spec)) (*oci.Driver, hypervisor.Spec, *guest) {
	t.Helper()
	d := newDriver(t, rt)
	s := guestSpec(t, cat[templates.Base], jobRunner)
	if edit != nil {
		edit(&s)
	}
	g, _, _, _ := boot(t, d, s)
	return d, s, g
}

// TestFailedRestoreLeavesNoDisk: a restore whose layer cannot be read lets go of the disk it
// attached for the new guest (no guest record held it, so no Delete could): its loop mount
// stayed, and removing the guest's dir failed ("device or resource busy"), as it did when
// TestSnapshotAcrossNodes removed a snapshot that the node was still restoring from.
func TestFailedRestoreLeavesNoDisk(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, oci.RuntimeRunsc)
	s := guestSpec(t, cat[templates.Base], "exit 1")
	dir := t.TempDir() // a snapshot whose layer is gone
	rec := fmt.Sprintf(`{"format":1,"runtime":"runsc","guest_id":"old","memory":false,"rootfs":%q,"layer":"writable.tar"}`, s.RootFS)
	if err := os.WriteFile(filepath.Join(dir, "snapshot.json"), []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	err := d.Restore(ctxT(t, time.Minute), s, dir)
	if err == nil {
		t.Fatal("a restore without its layer succeeded")
	}
	var w, parent syscall.Stat_t
	if syscall.Stat(s.Writable, &w) == nil && syscall.Stat(filepath.Dir(s.Writable), &parent) == nil && w.Dev != parent.Dev {
		_ = syscall.Unmount(s.Writable, syscall.MNT_DETACH)
		t.Fatalf("after the failed restore (%v) its disk is still mounted at %s", err, s.Writable)
	}
	if _, serr := os.Stat(filepath.Clean(s.Writable) + ".img"); serr == nil {
		t.Fatalf("after the failed restore (%v) its disk image is left", err)
	}
}

// TestFailedAdoptingRestoreLeavesNoDisk: a restore that took over the old guest's disk
// (RestoreAdopting: its layer bound at the new guest's, its image renamed to the new guest's)
// and then failed before any guest record held it lets go of it, as a restore that attached a
// new disk does (TestFailedRestoreLeavesNoDisk): the bind mount, and the loop device under it,
// stayed, and the node's removal of the new guest's dir met "device or resource busy".
func TestFailedAdoptingRestoreLeavesNoDisk(t *testing.T) {
	cat := catalog(t)
	d := newDriver(t, oci.RuntimeRunsc)
	ctx := ctxT(t, 3*time.Minute)
	old := guestSpec(t, cat[templates.Base], "exit 1")
	track(t, d, old)
	if err := d.Create(ctx, old); err != nil { // its disk attached: what a restore adopts
		t.Fatal(err)
	}
	var tgts []string
	for _, b := range old.ReadOnlyBinds {
		tgts = append(tgts, b.Target)
	}
	tj, _ := json.Marshal(tgts)
	dir := t.TempDir() // the memory snapshot just taken of old, as the record says
	rec := fmt.Sprintf(`{"format":1,"runtime":"runsc","guest_id":%q,"memory":true,"rootfs":%q,"bind_targets":%s,"agent_bin":false,"layer":"writable.tar"}`, old.ID, old.RootFS, tj)
	if err := os.WriteFile(filepath.Join(dir, "snapshot.json"), []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	s := guestSpec(t, cat[templates.Base], "exit 1")
	track(t, d, s)
	// Its agent dir a file: the restore fails at prepare, after it adopted the disk.
	if err := os.MkdirAll(filepath.Dir(s.AgentDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.AgentDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := d.RestoreAdopting(ctx, s, dir, old.ID)
	if err == nil {
		t.Fatal("a restore into an agent dir that is a file succeeded")
	}
	if mountOptions(t, s.Writable) != "" {
		_ = syscall.Unmount(s.Writable, syscall.MNT_DETACH)
		t.Fatalf("after the failed adopting restore (%v) the adopted disk is still mounted at %s", err, s.Writable)
	}
	if _, serr := os.Stat(filepath.Clean(s.Writable) + ".img"); serr == nil {
		t.Fatalf("after the failed adopting restore (%v) the adopted disk image is left", err)
	}
}

// TestListSaysWhatTheRuntimeSaid: a list the runtime fails names what it printed on stderr
// (which state file it could not read), its first and last bytes when it printed much; a
// list that works passes the driver's global flags as before. go-runc's List dropped the
// stderr: the error said only "runsc did not terminate successfully: exit status 2".
func TestListSaysWhatTheRuntimeSaid(t *testing.T) {
	for _, rt := range []string{oci.RuntimeRunc, oci.RuntimeRunsc} {
		t.Run(rt, func(t *testing.T) {
			real, err := exec.LookPath(rt)
			if err != nil {
				t.Fatalf("%s is not installed: apt-get install -y %s", rt, rt)
			}
			dir := t.TempDir()
			fail := filepath.Join(dir, "fail")
			wrapper := filepath.Join(dir, rt)
			script := `#!/bin/sh
for a in "$@"; do
	if [ "$a" = list ] && [ -e ` + shQuote(fail) + ` ]; then
		echo 'panic: cannot read state file "/x/bad_sandbox:bad.state": unexpected end of JSON input' >&2
		[ "$(cat ` + shQuote(fail) + `)" = long ] && head -c 20000 /dev/zero | tr '\0' 'g' >&2 && echo ' the end' >&2
		exit 2
	fi
done
exec ` + shQuote(real) + ` "$@"
`
			if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			d := newDriver(t, rt, func(o *oci.Options) { o.RuntimePath = wrapper })
			ctx := ctxT(t, time.Minute)
			if ids, err := d.List(ctx); err != nil || len(ids) != 0 {
				t.Fatalf("a list of no guest: %v, %v; want none, no error", ids, err)
			}
			if err := os.WriteFile(fail, []byte("short"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = d.List(ctx)
			if err == nil || !strings.Contains(err.Error(), `cannot read state file "/x/bad_sandbox:bad.state"`) || !strings.Contains(err.Error(), "exit status 2") {
				t.Fatalf("a failed list: %v; want the runtime's stderr and its exit status", err)
			}
			if err := os.WriteFile(fail, []byte("long"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = d.List(ctx)
			if err == nil || !strings.Contains(err.Error(), "cannot read state file") || !strings.Contains(err.Error(), "gg … gg") ||
				!strings.HasSuffix(err.Error(), "the end") || len(err.Error()) > 5<<10 {
				t.Fatalf("a failed list that printed 20 KiB (%d bytes of error): %.300s; want its first and last bytes, at most 5 KiB", len(fmt.Sprint(err)), err)
			}
		})
	}
}
