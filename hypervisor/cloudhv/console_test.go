package cloudhv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv/chapi"
	"wb/internal/proc"
)

// TestConsoleBounded: what a guest writes to its console, through a pseudo-terminal as CH's
// Pty console writes it, costs the host at most two logs of logMax, and what is kept
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
		if fi.Size() > logMax {
			t.Errorf("%s holds %d bytes, over %d", name, fi.Size(), logMax)
		}
		total += fi.Size()
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 || total < logMax {
		t.Errorf("the guest dir holds %d files, %d bytes of console", len(ents), total)
	}

	stopped := make(chan struct{})
	go func() { d.stopCopy(id, consoleFile); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stopCopy did not end the relay's read")
	}
	if _, ok := d.copies.Load(copyKey{id, consoleFile}); ok {
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

// TestVMMLogPipe: the VMM's log pipe, written as CH writes its log (through the write end
// that startVMM leaves non-blocking), never holds up the writer: while the copy is slow,
// 8 MiB of lines are written at once, and what does not fit is refused (EAGAIN: a line CH's
// logger drops). Without a reader (the node gone) a write fails at once (EPIPE); the pipe
// opened again (adoptLogs) is copied again, and once the writer has closed (the VMM's end)
// awaitVMMLog finds its last line in vmm.log. A vmm.pipe that is not a named pipe is refused.
func TestVMMLogPipe(t *testing.T) {
	d := &Driver{o: Options{StateDir: t.TempDir()}, log: slog.Default(), copyRate: 64 << 10, copyBurst: 64 << 10}
	const id = "gvmmlog"
	dir := d.GuestDir(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	pipes, err := d.openPipes(id)
	if err != nil {
		t.Fatal(err)
	}
	w := pipes[0]
	defer pipes[1].Close()
	defer w.Close()
	fd := int(w.Fd()) // blocking now, as after exec
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Repeat("x", 99) + "\n")
	var wrote, refused int
	t0 := time.Now()
	for range 80_000 {
		switch _, err := unix.Write(fd, line); {
		case err == nil:
			wrote++
		case errors.Is(err, unix.EAGAIN):
			refused++
		default:
			t.Fatal(err)
		}
	}
	t.Logf("8 MiB of lines in %s: %d written, %d refused", time.Since(t0), wrote, refused)
	if refused == 0 || time.Since(t0) > 30*time.Second {
		t.Errorf("the writer was held up or never refused, with a copy of 64 KiB/s")
	}

	d.stopCopy(id, vmmLogFile) // the node's end
	if _, err := unix.Write(fd, line); !errors.Is(err, unix.EPIPE) {
		t.Fatalf("a write without a reader: %v, want EPIPE", err)
	}
	f, err := openPipe(filepath.Join(dir, vmmPipeFile))
	if err != nil {
		t.Fatal(err)
	}
	d.copyRate = 0
	d.startCopy(id, vmmLogFile, f)
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := unix.Write(fd, []byte("the last line\n"))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
			t.Fatalf("the last line: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.Close() // the VMM's end
	d.awaitVMMLog(id)
	if d.copying(id, vmmLogFile) {
		t.Error("the copy did not end when the pipe's last writer closed")
	}
	if got := tail(filepath.Join(dir, vmmLogFile), 64); !strings.HasSuffix(got, "the last line") {
		t.Errorf("vmm.log's tail after the VMM's end: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(dir, vmmLogFile)); err != nil || fi.Size() > logMax {
		t.Errorf("vmm.log: %v, %v", fi, err)
	}

	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, vmmPipeFile), filepath.Join(other, "link")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"file", "link"} {
		if f, err := openPipe(filepath.Join(other, name)); err == nil {
			f.Close()
			t.Errorf("%s taken for a log pipe", name)
		}
	}
}

// TestEventLogCapped: the VMM's events, written into its event pipe as CH's event monitor
// writes them, are copied into the event log up to eventsMax and no further (a guest that
// resets a virtio device without end), with one warning; what was copied reads back as CH's
// events, from the first, and the copy ends when the VMM's write end closes.
func TestEventLogCapped(t *testing.T) {
	var logged bytes.Buffer
	d := &Driver{o: Options{StateDir: t.TempDir()}, log: slog.New(slog.NewTextHandler(&logged, nil))}
	const id = "gevents"
	if err := os.Mkdir(d.GuestDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	pipes, err := d.openPipes(id)
	if err != nil {
		t.Fatal(err)
	}
	pipes[0].Close()
	w := pipes[1]
	event := func(i int, source, ev string) []byte {
		return fmt.Appendf(nil, "{\n  \"timestamp\": {\n    \"secs\": %d,\n    \"nanos\": 0\n  },\n  \"source\": %q,\n  \"event\": %q,\n  \"properties\": {\n    \"id\": \"_net1\"\n  }\n}\n\n", i, source, ev)
	}
	written := 0
	for i := 0; written < 2*eventsMax; i++ {
		b := event(i, "virtio-device", "reset")
		if i == 0 {
			b = event(i, "vm", "booted")
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		written += len(b)
	}
	w.Close() // the VMM's end
	deadline := time.Now().Add(time.Minute)
	for d.copying(id, eventsFile) {
		if time.Now().After(deadline) {
			t.Fatal("the copy did not end with the pipe's writer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	f, err := os.Open(filepath.Join(d.GuestDir(id), eventsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, _ := f.Stat(); fi.Size() != eventsMax {
		t.Errorf("the event log holds %d bytes of the %d written; want %d", fi.Size(), written, eventsMax)
	}
	dec := chapi.NewEventDecoder(f)
	first, err := dec.Next()
	if err != nil || first.Source != "vm" || first.Event != "booted" {
		t.Fatalf("the first event: %+v, %v", first, err)
	}
	n := 1
	for ; ; n++ {
		if _, err := dec.Next(); err != nil {
			break
		}
	}
	t.Logf("%d events read back", n)
	if n < 1000 || strings.Count(logged.String(), "event log is full") != 1 {
		t.Errorf("%d events read back; the driver logged: %s", n, logged.String())
	}
}

// TestEventsAwaitTheCopy: a VMM that has exited may have written its last events into its
// pipe before this process copied them: the watch reads on until the copy ends, and finds
// the shutdown event, rather than answer that the VMM exited.
func TestEventsAwaitTheCopy(t *testing.T) {
	d := &Driver{o: Options{StateDir: t.TempDir(), EventInterval: 10 * time.Millisecond}, log: slog.Default()}
	const id = "gexited"
	if err := os.Mkdir(d.GuestDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.GuestDir(id), eventsFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pipes, err := d.openPipes(id)
	if err != nil {
		t.Fatal(err)
	}
	pipes[0].Close()
	d.copyRate, d.copyBurst = 0, 0
	f, err := os.Open(filepath.Join(d.GuestDir(id), eventsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	why := make(chan string, 1)
	go func() { why <- d.watch(context.Background(), record{Spec: hypervisor.Spec{ID: id}}, f) }() // no process: exited
	time.Sleep(100 * time.Millisecond)
	if _, err := pipes[1].WriteString("{\"timestamp\":{\"secs\":1,\"nanos\":0},\"source\":\"vm\",\"event\":\"shutdown\",\"properties\":null}\n\n"); err != nil {
		t.Fatal(err)
	}
	pipes[1].Close() // the VMM's end
	select {
	case got := <-why:
		if got != "event vm/shutdown" {
			t.Errorf("watch answered %q, want the shutdown event", got)
		}
	case <-time.After(time.Minute):
		t.Fatal("watch did not end with the copy")
	}
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
	d := &Driver{o: Options{StateDir: t.TempDir()}, log: slog.Default(), copyRate: 128 << 10, copyBurst: 64 << 10}
	const id = "grate"
	main, dir := relayTestConsole(t, d, id)
	defer d.stopCopy(id, consoleFile)
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

// TestAdoptLogsOfHungVMMs: a restarted driver's look at its guests' consoles is not held up
// by VMMs that take their API's calls and never answer: it gives each up after
// adoptConsoleWait, all at once. It copies the VMM log pipe that it finds.
func TestAdoptLogsOfHungVMMs(t *testing.T) {
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
		if i == 0 {
			pipes, err := d.openPipes(id)
			if err != nil {
				t.Fatal(err)
			}
			d.stopCopies(id) // the previous process's end
			for _, w := range pipes {
				defer w.Close() // the VMM's write ends
			}
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
	d.adoptLogs(context.Background())
	if took := time.Since(t0); took > 3*adoptConsoleWait {
		t.Errorf("adoptLogs took %s over three hung VMMs", took)
	}
	for i := range 3 {
		id := fmt.Sprintf("ghung%d", i)
		if _, ok := d.copies.Load(copyKey{id, consoleFile}); ok {
			t.Errorf("%s: a console relay without a console", id)
		}
		for _, name := range []string{vmmLogFile, eventsFile} {
			if got := d.copying(id, name); got != (i == 0) {
				t.Errorf("%s: %s copied: %v; only ghung0 has pipes", id, name, got)
			}
		}
	}
	d.Close()
}
