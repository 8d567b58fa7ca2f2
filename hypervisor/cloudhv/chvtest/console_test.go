package chvtest_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPtyConsole: a Pty console is a pseudo-terminal that the boot makes and vm.info names
// (none before the boot); the panic line of an out-of-memory comes out there, and the
// terminal closes with the VM. With panic_on_oom the first OOM kill panics whichever process
// it would have killed: init too, and a loaded host's kernel does kill init when the victim's
// memory is still charged at the next OOM (a CI run saw it, and no panic line).
func TestPtyConsole(t *testing.T) {
	for _, tc := range []struct{ name, hog string }{
		{"a child takes the memory", "hog 1024"},
		{"init takes the memory", "hoginit 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) { testPtyConsole(t, tc.hog) })
	}
}

func testPtyConsole(t *testing.T, hog string) {
	f := startFake(t)
	cfg := strings.Replace(f.config("sysctl.vm.panic_on_oom=1"), `"cpus"`, `"pvpanic":true,"console":{"mode":"Pty"},"cpus"`, 1)
	f.must("PUT", "vm.create", cfg, 204)
	if p := consolePath(t, f); p != "" {
		t.Fatalf("vm.info names console %q before the boot", p)
	}
	f.must("PUT", "vm.boot", "", 204)
	p := consolePath(t, f)
	if !strings.HasPrefix(p, "/dev/pts/") {
		t.Fatalf("vm.info names console %q after the boot, want /dev/pts/N", p)
	}
	con, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(con)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	c, _ := f.agent()
	defer c.Close()
	io.WriteString(c, hog+"\n") // four times the VM's memory
	timeout := time.After(2 * time.Minute)
	for found := false; !found; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the console closed before the panic line")
			}
			found = strings.Contains(l, "Kernel panic - not syncing: Out of memory")
		case <-timeout:
			t.Fatal("no panic line on the console")
		}
	}
	panics := func() int {
		return len(slices.DeleteFunc(eventNames(t, f.events.Bytes()), func(e string) bool { return e != "guest/panic" }))
	}
	waitFor(t, time.Minute, "the guest/panic event", func() bool { return panics() > 0 })
	time.Sleep(time.Second) // time for init's end to be seen: a hung kernel does not panic twice
	if n := panics(); n != 1 {
		t.Fatalf("%d guest/panic events, want 1", n)
	}
	f.must("PUT", "vm.shutdown", "", 204)
	select {
	case _, ok := <-lines:
		if ok {
			t.Fatal("the console carried more after the panic")
		}
	case <-time.After(time.Minute):
		t.Fatal("the console stayed open after vm.shutdown")
	}
}

// consolePath is vm.info's config.console.file.
func consolePath(t *testing.T, f *fake) string {
	t.Helper()
	var info struct {
		Config struct {
			Console struct {
				File string `json:"file"`
			} `json:"console"`
		} `json:"config"`
	}
	if err := json.Unmarshal([]byte(f.must("GET", "vm.info", "", 200)), &info); err != nil {
		t.Fatal(err)
	}
	return info.Config.Console.File
}
