package cloudhv_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
)

// TestLifecycle drives one guest through the fake VMM: create, boot, the agent answering
// Health and Exec over hybrid vsock, pause (exec gets no answer), resume, stop (one exit
// event), delete (no process, mount, loop device or dir left).
func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 5*time.Minute)
	s := e.spec(newID())
	if err := e.d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if info, err := e.d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateCreated || info.Pid == 0 {
		t.Fatalf("after create: %+v, %v; want created with the VMM's pid", info, err)
	}
	if ids, err := e.d.List(ctx); err != nil || len(ids) != 1 || ids[0] != s.ID {
		t.Fatalf("List = %v, %v; want [%s]", ids, err, s.ID)
	}
	if err := e.d.Boot(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	info, err := e.d.Info(ctx, s.ID)
	if err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("after boot: %+v, %v", info, err)
	}
	if sid, _ := unixGetsid(info.Pid); sid != info.Pid {
		t.Errorf("the VMM (pid %d) is in session %d, not its own: it would not outlive the node", info.Pid, sid)
	}
	events, err := e.d.Events(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	c := e.agentOf(s.ID)
	defer c.Close()
	waitHealthy(t, ctx, c, 2*time.Minute)
	if got := sh(t, ctx, c, "echo hello > /workspace/f && cat /workspace/f && echo $PATH"); !strings.HasPrefix(got, "hello\n") || !strings.Contains(got, ":/bin\n") {
		t.Errorf("exec in the guest: %q", got)
	}
	st, err := e.d.Stats(ctx, s.ID)
	if err != nil || st.CPUMs <= 0 || st.MemoryBytes <= 0 {
		t.Errorf("Stats = %+v, %v; want CPU and memory counted", st, err)
	}

	if err := e.d.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if info, err := e.d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StatePaused {
		t.Fatalf("after pause: %+v, %v", info, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	_, err = c.Exec(pctx, agent.ExecRequest{Argv: []string{"true"}}, nil)
	cancel()
	if err == nil {
		t.Fatal("a paused guest answered an exec")
	}
	if err := e.d.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, c, "cat /workspace/f"); got != "hello\n" {
		t.Errorf("after resume: %q", got)
	}
	select {
	case ev := <-events:
		t.Fatalf("an event before the stop: %+v", ev)
	default:
	}

	if err := e.d.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case ev, ok := <-events:
		if !ok || ev.Type != hypervisor.EventExit {
			t.Fatalf("after stop: %+v, %v; want an exit event", ev, ok)
		}
		// Its reason read from the VMM's events (through their pipe), not from its exit.
		if !strings.HasPrefix(ev.Detail, "event vm") {
			t.Errorf("exit detail %q: want the VMM's shutdown event", ev.Detail)
		}
	case <-time.After(time.Minute):
		t.Fatal("no exit event a minute after the stop")
	}
	if _, ok := <-events; ok {
		t.Error("the event channel stays open after the exit")
	}
	if info, err := e.d.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateStopped || info.Pid != 0 {
		t.Errorf("after stop: %+v, %v", info, err)
	}
	if _, err := e.d.DialAgent(ctx, s.ID); err == nil {
		t.Error("DialAgent reached a stopped guest")
	}
	if err := e.d.Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.d.GuestDir(s.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("guest dir after delete: %v", err)
	}
	if _, err := e.d.Info(ctx, s.ID); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("Info after delete: %v; want ErrNotFound", err)
	}
	if err := e.d.Delete(ctx, s.ID); err != nil {
		t.Errorf("a second delete: %v", err)
	}
	if l := e.leftovers(); len(l) > 0 {
		t.Errorf("left on the host after delete: %v", l)
	}
	// In every hierarchy (v1) or the one (v2): the fake's runc guest made its cgroup below
	// the VMM's in all of them.
	left, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", e.d.CgroupPath(s.ID)))
	if v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", e.d.CgroupPath(s.ID))); len(v2) > 0 {
		left = append(left, v2...)
	}
	if len(left) > 0 {
		t.Errorf("the VMM's cgroup is left: %v", left)
	}
}

// TestDeleteUnreadableRecord: Delete of a guest whose record cannot be read (a torn or
// corrupt guest.json) still ends its VMM, found through its cgroup, before its files go.
func TestDeleteUnreadableRecord(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 5*time.Minute)
	s := e.spec(newID())
	e.boot(t, ctx, s)
	info, err := e.d.Info(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.d.GuestDir(s.ID), "guest.json"), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Delete(ctx, s.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := syscall.Kill(info.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		if b, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", info.Pid)); rerr != nil || !strings.Contains(string(b), ") Z ") {
			t.Errorf("the VMM (pid %d) still runs after Delete (kill 0: %v)", info.Pid, err)
		}
	}
	if _, err := os.Stat(e.d.GuestDir(s.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the guest's dir after Delete: %v", err)
	}
	if left := e.leftovers(); len(left) > 0 {
		t.Errorf("left after Delete: %v", left)
	}
}

// TestNewRemovesStagedRestores: a restore staged by an earlier driver in the state dir itself
// (.restore-*), which a crash left there, is removed by the next New.
func TestNewRemovesStagedRestores(t *testing.T) {
	e := newEnv(t)
	staged := filepath.Join(e.opts.StateDir, ".restore-123")
	if err := os.MkdirAll(staged, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(staged, "memory-ranges"), []byte("memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cloudhv.New(t.Context(), e.opts); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(staged); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the staged restore after New: %v", err)
	}
}
