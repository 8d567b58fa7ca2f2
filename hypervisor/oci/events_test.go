package oci_test

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
)

// TestEventsWithoutRuntimeCall: Events on a guest the driver created follows the process the
// runtime's create reported (the one its state names too) without running the runtime (on
// runsc a `runsc state` is a process start and a sandbox RPC, on a session's first moments),
// and still reports the guest's exit.
func TestEventsWithoutRuntimeCall(t *testing.T) {
	cat := catalog(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			real, err := exec.LookPath(rt)
			if err != nil {
				t.Fatalf("%s is not installed: %v", rt, err)
			}
			base := t.TempDir()
			calls := filepath.Join(base, "calls")
			wrapper := filepath.Join(base, rt)
			script := "#!/bin/sh\necho \"$*\" >> " + calls + "\nexec " + real + " \"$@\"\n"
			if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			newDriver(t, rt) // the root and runtime checks
			d, err := oci.New(oci.Options{
				Runtime:      rt,
				RuntimePath:  wrapper,
				StateRoot:    filepath.Join(base, "state"),
				BundleRoot:   filepath.Join(base, "bundles"),
				CgroupParent: "/wbtest-" + randHex(t, 4),
				Logger:       slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.RemoveCgroupParent() })
			s := guestSpec(t, cat[templates.Base], jobRunner)
			boot(t, d, s)
			ctx := ctxT(t, time.Minute)
			info, err := d.Info(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(filepath.Join(d.BundleDir(s.ID), "init.pid"))
			if err != nil {
				t.Fatal(err)
			}
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err != nil || pid != info.Pid {
				t.Fatalf("create's pid file says %q, the runtime's state pid %d", raw, info.Pid)
			}
			before := runtimeCalls(t, calls)
			events, err := d.Events(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if after := runtimeCalls(t, calls); after != before {
				t.Fatalf("Events ran the runtime %d times (%s), want none", after-before, lastCall(t, calls))
			}
			if err := d.Stop(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			select {
			case ev, ok := <-events:
				if !ok || ev.Type != hypervisor.EventExit {
					t.Fatalf("event after stop = %+v (open %v), want exit", ev, ok)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("no exit event within 20s of stop")
			}
		})
	}
}

func runtimeCalls(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func lastCall(t *testing.T, path string) string {
	t.Helper()
	b, _ := os.ReadFile(path)
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	return l[len(l)-1]
}
