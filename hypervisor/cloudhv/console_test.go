package cloudhv

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/term"

	"wb/hypervisor"
	"wb/internal/proc"
)

// TestConsoleBounded: what a guest writes to its console, through a pseudo-terminal as CH's
// Pty console writes it, costs the host at most two logs of consoleLogMax, and what is kept
// is the newest: 8 MiB, then a last line. Stopping the relay ends its read at once, though
// the terminal stays open (Delete, Close).
func TestConsoleBounded(t *testing.T) {
	d := &Driver{o: Options{StateDir: t.TempDir()}, log: slog.Default()}
	const id = "gconsole"
	main, dir := relayTestConsole(t, d, id)
	for _, p := range []string{"/tmp/not-a-terminal", "/dev/pts/../../etc/passwd", "/dev/pts/ptmx/x", "/dev/pts"} {
		if err := d.relayConsole("gother", p); err == nil || !strings.Contains(err.Error(), "not a pseudo-terminal") {
			t.Fatalf("console %s: %v", p, err)
		}
	}
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	for range 128 {
		if _, err := main.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := main.WriteString("\nthe last line\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.HasSuffix(consoleTail(dir, 4096), "the last line") {
		if time.Now().After(deadline) {
			t.Fatalf("the console's tail is %q", consoleTail(dir, 64))
		}
		time.Sleep(10 * time.Millisecond)
	}
	var total int64
	for _, name := range []string{consoleFile, consoleFile + ".1"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > consoleLogMax {
			t.Errorf("%s holds %d bytes, over %d", name, fi.Size(), consoleLogMax)
		}
		total += fi.Size()
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 || total < consoleLogMax {
		t.Errorf("the guest dir holds %d files, %d bytes of console", len(ents), total)
	}

	stopped := make(chan struct{})
	go func() { d.stopConsole(id); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stopConsole did not end the relay's read")
	}
	if _, ok := d.consoles.Load(id); ok {
		t.Error("the stopped relay is still listed")
	}
}

// relayTestConsole makes guest id's dir and a pseudo-terminal, raw as CH's create_pty makes
// it, and has d copy it; it answers the terminal's main side (what CH writes to) and the dir.
func relayTestConsole(t *testing.T, d *Driver, id string) (*os.File, string) {
	t.Helper()
	main, sub, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { main.Close(); sub.Close() })
	if _, err := term.MakeRaw(int(sub.Fd())); err != nil {
		t.Fatal(err)
	}
	dir := d.GuestDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.relayConsole(id, sub.Name()); err != nil {
		t.Fatal(err)
	}
	return main, dir
}

// TestRotatingLogAppends: a relay started again (a restarted node) appends to the console
// log it finds, and a log found over the bound (an earlier driver's File console) is moved
// aside before the first write.
func TestRotatingLogAppends(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, consoleFile)
	if err := os.WriteFile(p, []byte("before\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l := &rotatingLog{path: p, max: 16}
	if _, err := l.Write([]byte("after\n")); err != nil {
		t.Fatal(err)
	}
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "before\nafter\n" {
		t.Fatalf("console.log %q", b)
	}
	if err := os.WriteFile(p, bytes.Repeat([]byte("o"), 40), 0o600); err != nil {
		t.Fatal(err)
	}
	l = &rotatingLog{path: p, max: 16}
	if n, err := l.Write([]byte("0123456789abcdefXY")); n != 18 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	_ = l.close()
	if b, _ := os.ReadFile(p); string(b) != "XY" {
		t.Errorf("console.log %q, want XY", b)
	}
	if b, _ := os.ReadFile(p + ".1"); string(b) != "0123456789abcdef" {
		t.Errorf("console.log.1 %q", b)
	}
	if got := consoleTail(dir, 4); got != "efXY" {
		t.Errorf("consoleTail across the two = %q", got)
	}
}

// TestConsoleRateBounded: the copy reads a console no faster than the driver's bound (the
// rest waits in the terminal, then in the VMM, whose CPU is the guest's): 320 KiB at 128
// KiB/s after a burst of 64 KiB take two seconds at least.
func TestConsoleRateBounded(t *testing.T) {
	d := &Driver{o: Options{StateDir: t.TempDir()}, log: slog.Default(), consoleRate: 128 << 10, consoleBurst: 64 << 10}
	const id = "grate"
	main, dir := relayTestConsole(t, d, id)
	defer d.stopConsole(id)
	t0 := time.Now()
	go func() {
		_, _ = main.Write(bytes.Repeat([]byte("y"), 320<<10))
		_, _ = main.WriteString("\nend\n")
	}()
	deadline := time.Now().Add(time.Minute)
	for !strings.HasSuffix(consoleTail(dir, 64), "end") {
		if time.Now().After(deadline) {
			t.Fatal("the copy never reached the end")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if took := time.Since(t0); took < 1500*time.Millisecond {
		t.Errorf("320 KiB copied in %s, faster than 128 KiB/s", took)
	} else {
		t.Logf("320 KiB copied in %s", took)
	}
}

// TestAdoptConsolesOfHungVMMs: a restarted driver's look at its guests' consoles is not held
// up by VMMs that take their API's calls and never answer: it gives each up after
// adoptConsoleWait, all at once.
func TestAdoptConsolesOfHungVMMs(t *testing.T) {
	d := &Driver{o: Options{StateDir: t.TempDir()}, log: slog.Default()}
	start, ok := proc.Start(os.Getpid())
	if !ok {
		t.Fatal("no start time for this process")
	}
	for i := range 3 {
		id := fmt.Sprintf("ghung%d", i)
		if err := os.MkdirAll(d.GuestDir(id), 0o700); err != nil {
			t.Fatal(err)
		}
		// This test's own process stands in for the VMM: alive, with an API that never answers.
		if err := writeJSON(filepath.Join(d.GuestDir(id), recordFile), record{Spec: hypervisor.Spec{ID: id}, Pid: os.Getpid(), Start: start}); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("unix", filepath.Join(d.GuestDir(id), apiSocket))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
	}
	t0 := time.Now()
	d.adoptConsoles(context.Background())
	if took := time.Since(t0); took > 3*adoptConsoleWait {
		t.Errorf("adoptConsoles took %s over three hung VMMs", took)
	}
	for i := range 3 {
		if _, ok := d.consoles.Load(fmt.Sprintf("ghung%d", i)); ok {
			t.Errorf("ghung%d: a console relay without a console", i)
		}
	}
}
