package cloudhv_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv"
	"wb/hypervisor/cloudhv/chvtest"
)

// TestGuestFloodsVMMLog: a guest that writes to the debug port 0x80 without end (CH logs a
// warning for each byte) neither fills the host's disk nor stalls: 200,000 writes return,
// vmm.log and vmm.log.1 stay within 1 MiB each, the newest line is kept, and the guest's
// agent answers. With the node gone (the driver closed: nobody reads the VMM's log pipe) the
// VMM drops its lines and runs on; a restarted driver copies them again.
func TestGuestFloodsVMMLog(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, 5*time.Minute)
	s := e.spec(newID())
	c := e.boot(t, ctx, s)
	dir := e.d.GuestDir(s.ID)
	if !cloudhv.PipesCopied(e.d, s.ID) {
		t.Fatal("the VMM's log is not copied")
	}
	flood := func() {
		t0 := time.Now()
		sh(t, ctx, c, "head -c 200000 /dev/zero > "+chvtest.DebugPort)
		t.Logf("200,000 writes to the debug port in %s", time.Since(t0))
	}
	flood()
	awaitPortLine(t, ctx, c, dir, 0x41)
	for _, name := range []string{"vmm.log", "vmm.log.1"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 1<<20 {
			t.Errorf("%s holds %d bytes, over 1 MiB", name, fi.Size())
		}
	}
	if got := sh(t, ctx, c, "echo ok"); got != "ok\n" {
		t.Errorf("the guest after its flood: %q", got)
	}

	e.d.Close()
	flood()
	d2, err := cloudhv.New(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if info, err := d2.Info(ctx, s.ID); err != nil || info.State != hypervisor.StateRunning {
		t.Fatalf("the VMM after a flood without a reader: %+v, %v", info, err)
	}
	if !cloudhv.PipesCopied(d2, s.ID) {
		t.Fatal("the restarted driver does not copy the VMM's log")
	}
	awaitPortLine(t, ctx, c, dir, 0x42)
}

// awaitPortLine writes code to the guest's debug port until the VMM's line for it is in the
// tail of vmm.log: a line the VMM wrote while its log pipe was full is dropped.
func awaitPortLine(t *testing.T, ctx context.Context, c *agent.Client, dir string, code byte) {
	t.Helper()
	want := fmt.Sprintf("code 0x%x]", code)
	deadline := time.Now().Add(time.Minute)
	for {
		sh(t, ctx, c, fmt.Sprintf("printf '\\%03o' > %s", code, chvtest.DebugPort))
		time.Sleep(100 * time.Millisecond)
		b, _ := os.ReadFile(filepath.Join(dir, "vmm.log"))
		if strings.Contains(string(b[max(0, len(b)-4096):]), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in vmm.log's tail: %q", want, b[max(0, len(b)-512):])
		}
	}
}

// TestVMMExitsAtOnce: a VMM that exits before its API answers fails the create with its last
// words, which reach vmm.log through the log pipe's copy.
func TestVMMExitsAtOnce(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t, time.Minute)
	o := e.opts
	o.Binary = filepath.Join(e.base, "exits-at-once")
	if err := os.WriteFile(o.Binary, []byte("#!/bin/sh\necho 'Error parsing config: its last words' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := cloudhv.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s := e.spec(newID())
	err = d.Create(ctx, s)
	if err == nil || !strings.Contains(err.Error(), "its last words") {
		t.Fatalf("Create with a VMM that exits at once: %v", err)
	}
	t.Log(err)
}
