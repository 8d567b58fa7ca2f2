package oci

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/internal/proc"
)

// TestEventsPidsStartPastHalf: a watch that starts on a sandbox already past half its host
// limit (a node's restart adopting its guests: the count does not fall back once a bomb was
// ended) takes that count for where it is, and reports only as it grows by another eighth.
// Reporting it at once had the new node's agent end every process of a guest that ran no
// bomb, at each restart. Fake cgroup files; the test process stands in for the sandbox.
func TestEventsPidsStartPastHalf(t *testing.T) {
	root := t.TempDir()
	d := &Driver{name: RuntimeRunsc, cg: cgroupHost{v2: true, v2Root: root}, bundleRoot: t.TempDir(),
		eventInterval: 5 * time.Millisecond, log: slog.New(slog.NewTextHandler(io.Discard, nil)), inits: map[string]initProc{}}
	s := hypervisor.Spec{ID: "g1"}
	cg := filepath.Join(root, "wb", s.ID)
	if err := os.MkdirAll(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.BundleDir(s.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(d.BundleDir(s.ID), guestFile), guestRecord{Spec: s, CgroupsPath: "/wb/g1", Runtime: RuntimeRunsc}); err != nil {
		t.Fatal(err)
	}
	set := func(file, v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(cg, file), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("memory.events", "oom 0\noom_kill 0")
	set("pids.max", "1000")
	set("pids.current", "600") // 60 %, where an ended bomb left it
	start, ok := proc.Start(os.Getpid())
	if !ok {
		t.Fatal("no start time of the test process")
	}
	d.inits[s.ID] = initProc{pid: os.Getpid(), start: start, state: hypervisor.StateRunning}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := d.Events(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, cur := range []string{"600", "650", "700", "725", "760"} {
		set("pids.current", cur)
		select {
		case ev := <-ch:
			got = append(got, cur+": "+ev.Type+" "+ev.Detail)
		case <-time.After(300 * time.Millisecond): // 60 polls, on a loaded host a few
		}
	}
	want := []string{"725: pids the sandbox's host tasks: pids.current=725 of pids.max=1000 (72%)"}
	if !slices.Equal(got, want) {
		t.Errorf("a watch that started at 600 of 1,000, as the count grew: %q; want %q", got, want)
	}
}
