package cloudhv_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
)

// TestNewRefuses: a missing or non-executable binary, or a missing kernel, is an error naming
// the path and the flag that gives it.
func TestNewRefuses(t *testing.T) {
	need(t)
	dir := t.TempDir()
	notExec := filepath.Join(dir, "ch")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := cloudhv.Options{Binary: shared.fakech, Kernel: shared.kernel, StateDir: filepath.Join(dir, "s")}
	for _, tc := range []struct {
		name string
		edit func(*cloudhv.Options)
		want []string
	}{
		{"no binary", func(o *cloudhv.Options) { o.Binary = "" }, []string{"--ch-binary"}},
		{"missing binary", func(o *cloudhv.Options) { o.Binary = filepath.Join(dir, "nope") }, []string{"--ch-binary", filepath.Join(dir, "nope")}},
		{"binary not executable", func(o *cloudhv.Options) { o.Binary = notExec }, []string{"--ch-binary", notExec}},
		{"no kernel", func(o *cloudhv.Options) { o.Kernel = "" }, []string{"--kernel"}},
		{"missing kernel", func(o *cloudhv.Options) { o.Kernel = filepath.Join(dir, "vmlinuz") }, []string{"--kernel", filepath.Join(dir, "vmlinuz")}},
		{"missing initramfs", func(o *cloudhv.Options) { o.Initramfs = filepath.Join(dir, "initrd") }, []string{"--initramfs", filepath.Join(dir, "initrd")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.edit(&o)
			_, err := cloudhv.New(context.Background(), o)
			if err == nil {
				t.Fatal("New accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// TestVMMDiesAtStart: a VMM that exits before its API answers fails Create with what it
// said, and leaves nothing behind.
func TestVMMDiesAtStart(t *testing.T) {
	e := newEnv(t)
	script := filepath.Join(e.base, "dying-ch")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'cannot open /dev/kvm' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := e.opts
	o.Binary = script
	d, err := cloudhv.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 3*time.Minute)
	s := e.spec(newID())
	err = d.Create(ctx, s)
	if err == nil || !strings.Contains(err.Error(), "cannot open /dev/kvm") {
		t.Fatalf("Create = %v; want the VMM's own complaint", err)
	}
	if _, err := os.Stat(d.GuestDir(s.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("guest dir after a failed create: %v", err)
	}
}

// TestVMMDiesBeforeBoot: a VMM killed between create and boot makes Boot, Pause and DialAgent
// fail (the guest is stopped), Events report the exit, and Delete clean up.
func TestVMMDiesBeforeBoot(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 3*time.Minute)
	s := e.spec(newID())
	if err := e.d.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	info, err := e.d.Info(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	events, err := e.d.Events(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if ev.Type != hypervisor.EventExit {
			t.Fatalf("event %+v; want exit", ev)
		}
	case <-time.After(time.Minute):
		t.Fatal("no exit event after the VMM was killed")
	}
	if err := e.d.Boot(ctx, s.ID); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("Boot of a dead VMM: %v", err)
	}
	if _, err := e.d.DialAgent(ctx, s.ID); err == nil {
		t.Error("DialAgent reached a dead VMM")
	}
	if st, err := e.d.Info(ctx, s.ID); err != nil || st.State != hypervisor.StateStopped {
		t.Errorf("Info = %+v, %v; want stopped", st, err)
	}
	if err := e.d.Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"cpuacct", "memory"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", sub, e.d.CgroupPath(s.ID))); err == nil {
			t.Errorf("the dead VMM's %s cgroup is left after delete", sub)
		}
	}
	if _, err := e.d.DialAgent(ctx, "nosuch"); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("DialAgent of an unknown guest: %v; want ErrNotFound", err)
	}
}
