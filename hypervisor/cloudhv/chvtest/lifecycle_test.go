package chvtest_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/cloudhv/chvtest"
)

func eventNames(t testing.TB, b []byte) []string {
	var out []string
	for _, e := range parseEvents(t, b) {
		out = append(out, e.String())
	}
	return out
}

// TestPauseFreezesTheGuest: while paused the guest's counter stops; after resume it moves
// again. A CONNECT made while paused is answered only after the resume.
func TestPauseFreezesTheGuest(t *testing.T) {
	f := startFake(t)
	f.boot()
	c, r := f.agent()
	defer c.Close()
	read := func() int {
		n, _ := strconv.Atoi(f.counter())
		return n
	}
	waitFor(t, time.Minute, "the guest's counter to move", func() bool { return read() > 3 })
	f.must("PUT", "vm.pause", "", 204)
	frozen := read()
	time.Sleep(300 * time.Millisecond) // the guest would count ~60 in this time
	if now := read(); now != frozen {
		t.Fatalf("counter moved from %d to %d while paused", frozen, now)
	}
	// A CONNECT now waits for the resume, as CH's paused vsock device answers nothing.
	answered := make(chan string, 1)
	go func() {
		_, _, line, _ := vsockDial(t, f.vsock, 1024)
		answered <- line
	}()
	select {
	case line := <-answered:
		t.Fatalf("CONNECT answered %q while paused", line)
	case <-time.After(200 * time.Millisecond):
	}
	f.must("PUT", "vm.resume", "", 204)
	waitFor(t, time.Minute, "the counter to move after resume", func() bool { return read() > frozen })
	select {
	case line := <-answered:
		if !strings.HasPrefix(line, "OK ") {
			t.Fatalf("CONNECT made while paused: %q after resume", line)
		}
	case <-time.After(time.Minute):
		t.Fatal("CONNECT made while paused not answered after resume")
	}
	if got := ask(t, c, r, "count"); got == "" {
		t.Fatal("no count")
	}
}

// TestEventStream checks the event monitor's output: CH's pretty-printed objects back to
// back, in order, with timestamps that do not go back.
func TestEventStream(t *testing.T) {
	f := startFake(t)
	f.boot()
	f.must("PUT", "vm.pause", "", 204)
	f.must("PUT", "vm.resume", "", 204)
	f.must("PUT", "vm.pause", "", 204)
	f.must("PUT", "vm.pause", "", 500) // refused, but CH emitted "pausing" first
	snap := filepath.Join(f.dir, "snap")
	os.Mkdir(snap, 0o700)
	f.must("PUT", "vm.snapshot", `{"destination_url":"file://`+snap+`"}`, 204)
	f.must("PUT", "vm.resize", `{"desired_vcpus":2}`, 204)
	f.must("PUT", "vmm.shutdown", "", 200)
	select {
	case err := <-f.done:
		f.done <- err
	case <-time.After(2 * time.Minute):
		t.Fatal("the VMM did not exit after vmm.shutdown")
	}
	raw := f.events.Bytes()
	want := []string{"vmm/starting", "vm/booting", "vm/booted", "vm/pausing", "vm/paused", "vm/resuming", "vm/resumed",
		"vm/pausing", "vm/paused", "vm/pausing", "vm/snapshotting", "vm/snapshotted", "vm/resizing", "vm/resized",
		"vm/shutdown", "vm/deleted", "vmm/shutdown"}
	if got := eventNames(t, raw); !slices.Equal(got, want) {
		t.Fatalf("events\n got %q\nwant %q", got, want)
	}
	// The exact shape of one record: serde_json's pretty printer, then a blank line.
	first := string(raw[:strings.Index(string(raw), "\n\n")+2])
	shape := "{\n  \"timestamp\": {\n    \"secs\": 0,\n    \"nanos\": "
	if !strings.HasPrefix(first, shape) || !strings.HasSuffix(first, "\n  },\n  \"source\": \"vmm\",\n  \"event\": \"starting\",\n  \"properties\": null\n}\n\n") {
		t.Fatalf("first record %q is not CH's pretty-printed shape", first)
	}
	var last time.Duration
	for _, e := range parseEvents(t, raw) {
		d := time.Duration(*e.Timestamp.Secs)*time.Second + time.Duration(*e.Timestamp.Nanos)
		if d < last {
			t.Fatalf("timestamp of %v goes back: %v < %v", e, d, last)
		}
		last = d
	}
}

// TestGuestExit: init ending with status 0 is a power-off (CH shuts the VMM down); with
// another status a kernel panic, reported through pvpanic, the VM left Running.
func TestGuestExit(t *testing.T) {
	t.Run("panic", func(t *testing.T) {
		f := startFake(t)
		cfg := strings.Replace(f.config(""), `"cpus"`, `"pvpanic":true,"cpus"`, 1)
		f.must("PUT", "vm.create", cfg, 204)
		f.must("PUT", "vm.boot", "", 204)
		c, r := f.agent()
		defer c.Close()
		io.WriteString(c, "exit 3\n")
		_, _ = r.ReadString('\n')
		waitFor(t, time.Minute, "the guest/panic event", func() bool {
			return slices.Contains(eventNames(t, f.events.Bytes()), "guest/panic")
		})
		for _, e := range parseEvents(t, f.events.Bytes()) {
			if e.String() == "guest/panic" && e.Properties["event"] != "panic" {
				t.Errorf("guest/panic properties %v, want event=panic", e.Properties)
			}
		}
		if info := f.must("GET", "vm.info", "", 200); !strings.Contains(info, `"state":"Running"`) {
			t.Errorf("vm.info after the panic: %s, want Running (a hung guest)", info)
		}
	})
	t.Run("power-off", func(t *testing.T) {
		f := startFake(t)
		f.boot()
		c, _ := f.agent()
		defer c.Close()
		io.WriteString(c, "exit 0\n")
		select {
		case err := <-f.done:
			f.done <- err
		case <-time.After(2 * time.Minute):
			t.Fatal("the VMM did not exit after the guest powered off")
		}
		want := []string{"vmm/starting", "vm/booting", "vm/booted", "vm/shutdown", "vm/deleted", "vmm/shutdown"}
		if got := eventNames(t, f.events.Bytes()); !slices.Equal(got, want) {
			t.Fatalf("events %q, want %q", got, want)
		}
	})
}

// TestSnapshotRestore: a snapshot of a paused VM holds CH's files; a restore in a new VMM is
// Paused until resumed, and the guest then runs again on the disk the snapshot named.
func TestSnapshotRestore(t *testing.T) {
	f := startFake(t)
	f.boot()
	c, r := f.agent()
	if got := ask(t, c, r, "write /workspace/kept before-snapshot"); got != "ok" {
		t.Fatal(got)
	}
	c.Close()
	f.must("PUT", "vm.pause", "", 204)
	snap := filepath.Join(f.dir, "snap")
	os.Mkdir(snap, 0o700)
	f.must("PUT", "vm.snapshot", `{"destination_url":"file://`+snap+`"}`, 204)
	for _, name := range []string{"config.json", "state.json", "memory-ranges"} {
		if fi, err := os.Stat(filepath.Join(snap, name)); err != nil || fi.Size() == 0 {
			t.Fatalf("snapshot file %s: %v", name, err)
		}
	}
	// A second snapshot into the same dir fails: CH creates its files exclusively.
	if code, body := f.do("PUT", "vm.snapshot", `{"destination_url":"file://`+snap+`"}`); code != 500 || !strings.Contains(body, "Cannot send VM snapshot") {
		t.Fatalf("snapshot into a used dir: %d %s", code, body)
	}
	f.must("PUT", "vm.delete", "", 204)

	g := startFake(t)
	// The restore uses the snapshot's disks and vsock socket (f's; f has released them).
	g.vsock = f.vsock
	g.must("PUT", "vm.restore", `{"source_url":"file://`+snap+`","resume":true}`, 204)
	if info := g.must("GET", "vm.info", "", 200); !strings.Contains(info, `"state":"Running"`) {
		t.Fatalf("after restore with resume: %s", info)
	}
	c, r = g.agent()
	defer c.Close()
	if got := ask(t, c, r, "read /workspace/kept"); got != "before-snapshot" {
		t.Fatalf("the restored guest reads %q from its disk", got)
	}
	want := []string{"vmm/starting", "vm/restoring", "vm/restored", "vm/resuming", "vm/resumed"}
	if got := eventNames(t, g.events.Bytes()); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// TestBadInput: malformed JSON, a wrong method, an unknown path, a duplicate device id.
func TestBadInput(t *testing.T) {
	f := startFake(t)
	for _, tc := range []struct {
		method, op, body string
		status           int
		want             string
	}{
		{"PUT", "vm.create", `{"payload":`, 400, `["Failed to deserialize JSON",`},
		{"PUT", "vm.create", `[1,2]`, 400, `["Failed to deserialize JSON",`},
		{"PUT", "vm.create", ``, 400, ``},
		{"GET", "vm.create", ``, 400, `["Bad Request"]`},
		{"GET", "vm.pause", ``, 400, `["Bad Request"]`},
		{"POST", "vm.pause", ``, 400, ``},
		{"PUT", "vm.info", ``, 400, `["Bad Request"]`},
		{"PUT", "vm.frobnicate", ``, 404, `["Not Found"]`},
		{"GET", "nothing/here", ``, 404, `["Not Found"]`},
	} {
		if code, body := f.do(tc.method, tc.op, tc.body); code != tc.status || !strings.HasPrefix(body, tc.want) || tc.want == "" && body != "" {
			t.Errorf("%s %s %q: %d %s, want %d %s", tc.method, tc.op, tc.body, code, body, tc.status, tc.want)
		}
	}
	f.must("PUT", "vm.create", f.config(""), 204)
	f.must("PUT", "vm.add-net", `{"id":"net0","tap":"t0"}`, 204)
	if code, body := f.do("PUT", "vm.add-net", `{"id":"net0","tap":"t1"}`); code != 409 ||
		body != `["Error from API","The network device could not be added to the VM","Failed to validate config","Identifier net0 is not unique"]` {
		t.Errorf("duplicate net id: %d %s", code, body)
	}
	if code, body := f.do("PUT", "vm.add-net", `{"id":"rootfs","tap":"t1"}`); code != 409 || !strings.Contains(body, "Identifier rootfs is not unique") {
		t.Errorf("net id of a disk: %d %s", code, body)
	}
	// A config with two disks of one id boots to a 409, as CH's validation at boot.
	f.must("PUT", "vm.delete", "", 204)
	dup := strings.Replace(f.config(""), `"id":"writable"`, `"id":"rootfs"`, 1)
	f.must("PUT", "vm.create", dup, 204)
	if code, body := f.do("PUT", "vm.boot", ""); code != 409 || !strings.Contains(body, "Identifier rootfs is not unique") {
		t.Errorf("boot with duplicate disk ids: %d %s", code, body)
	}
}

// TestCommand runs fakech as a driver does: CH's flags, the event monitor on fd 3 (a pipe);
// vmm.shutdown answers 200 and the process exits 0.
func TestCommand(t *testing.T) {
	dir := reachableTempDir(t)
	sock := filepath.Join(dir, "api.sock")
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, shared.fakech, "--api-socket", "path="+sock, "--event-monitor", "fd=3")
	cmd.ExtraFiles = []*os.File{pw}
	cmd.Env = append(os.Environ(), "WB_FAKECH_STATE_DIR="+filepath.Join(dir, "state"), "WB_FAKECH_LOG="+filepath.Join(dir, "fakech.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	events := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(bufio.NewReader(pr))
		events <- b
	}()
	waitFor(t, time.Minute, "the API socket", func() bool { return listening(sock) })
	c := unixClient(sock)
	if code, body := doRequest(t, c, "GET", "vmm.ping", ""); code != http.StatusOK || !strings.Contains(body, `"version"`) {
		t.Fatalf("ping: %d %s", code, body)
	}
	f := &fake{t: t, dir: dir, client: c, vsock: filepath.Join(dir, "vsock.sock")}
	f.writable = writableImage(t, dir)
	f.boot()
	conn, r := f.agent()
	if got := ask(t, conn, r, "hi"); got != "hi" {
		t.Fatalf("echo through fakech's vsock: %q", got)
	}
	conn.Close()
	if code, _ := doRequest(t, c, "PUT", "vmm.shutdown", ""); code != http.StatusOK {
		t.Fatalf("vmm.shutdown: %d", code)
	}
	if err := cmd.Wait(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "fakech.log"))
		t.Fatalf("fakech exited with %v; log:\n%s", err, log)
	}
	got := eventNames(t, <-events)
	want := []string{"vmm/starting", "vm/booting", "vm/booted", "vm/shutdown", "vm/deleted", "vmm/shutdown"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the API socket is still there after exit: %v", err)
	}
	checkNoLeaks(t, filepath.Join(dir, "state"), f.writable)
}

var _ = chvtest.VsockGuestDir
