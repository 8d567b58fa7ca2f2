package proc

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestParseHostBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	got, err := parseHostBusy("cpu  2845435 610884 1579657 3389195 91879 7 49696 9099 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
	want := (2845435 + 610884 + 1579657 + 7 + 49696) * tick
	if err != nil || got != want {
		t.Errorf("parseHostBusy = %v, %v; want %v (neither idle, iowait nor steal)", got, err, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu 1 2 x 4 5 6 7 8\n", "cpu 1 2 -3 4 5 6 7 8\n",
		"cpu 1 2 99999999999999999999 4 5 6 7 8\n", "cpu 1 2 92233720368547758 4 5 6 7 8\n"} {
		if d, err := parseHostBusy(bad); err == nil {
			t.Errorf("parseHostBusy(%q) = %v, no error", bad, d)
		}
	}
}

func TestParseCPU(t *testing.T) {
	// A command name with spaces and a ") " of its own, as a process may name itself.
	line := "27842 (a) b (c) R 27836 27836 1736 0 -1 4194304 102 0 0 0 7 3 11 13 20 0 1 0 4339701 3133440 389\n"
	self, children, err := parseCPU(line)
	if err != nil || self != 10*tick || children != 24*tick {
		t.Errorf("parseCPU = %v, %v, %v; want %v, %v", self, children, err, 10*tick, 24*tick)
	}
	for _, bad := range []string{"", "1 (x R 1 2", "1 (x) R 1 2 3 4 5 6 7 8 9 10 11 12", "1 (x) R 1 2 3 4 5 6 7 8 9 10 u 12 13 14"} {
		if s, c, err := parseCPU(bad); err == nil {
			t.Errorf("parseCPU(%q) = %v, %v, no error", bad, s, c)
		}
	}
}

// TestCPUCounts: this process's own CPU grows while it spins, and so does the host's busy
// time; a child's CPU is counted to this process once it was waited for.
func TestCPUCounts(t *testing.T) {
	busy0, err := HostBusy()
	if err != nil {
		t.Fatal(err)
	}
	self0, children0, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spin until this process has used 100 ms of CPU, however many others share the host's
	// CPUs meanwhile (a wall-clock spin got little of it under a loaded make test).
	for deadline := time.Now().Add(30 * time.Second); ; {
		self, _, err := CPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if self-self0 >= 100*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("this process's CPU grew %v in 30 s of spinning", self-self0)
		}
	}
	// A child that spins as long: sh's own loop, a second or so of CPU.
	if out, err := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done").CombinedOutput(); err != nil {
		t.Fatalf("the child: %v: %s", err, out)
	}
	busy1, err := HostBusy()
	if err != nil {
		t.Fatal(err)
	}
	self1, children1, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Wide margins: the host's time is sampled a tick (10 ms) at a time, a process's is not.
	if d := children1 - children0; d < 20*time.Millisecond {
		t.Errorf("its children's CPU grew %v over a child's spin", d)
	}
	if d := busy1 - busy0; d < (self1-self0)/2 {
		t.Errorf("the host was busy %v while this process alone took %v", d, self1-self0)
	}
	if _, _, err := CPU(1 << 30); err == nil {
		t.Error("CPU of a pid that cannot be: no error")
	}
}

// Whatever a stat line holds, parseCPU answers an error or two times that are not negative.
func FuzzParseCPU(f *testing.F) {
	f.Add("1 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16")
	f.Add("1 (a) b) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14")
	f.Add(strings.Repeat(")", 20))
	f.Fuzz(func(t *testing.T, line string) {
		self, children, err := parseCPU(line)
		if err == nil && (self < 0 || children < 0) {
			t.Fatalf("parseCPU(%q) = %v, %v", line, self, children)
		}
	})
}

// Whatever /proc/stat holds, parseHostBusy answers an error or a time that is not negative.
func FuzzParseHostBusy(f *testing.F) {
	f.Add("cpu  1 2 3 4 5 6 7 8 9 10\n")
	f.Add("cpu 9223372036854775807 2 3 4 5 6 7 8")
	f.Fuzz(func(t *testing.T, stat string) {
		if d, err := parseHostBusy(stat); err == nil && d < 0 {
			t.Fatalf("parseHostBusy(%q) = %v", stat, d)
		}
	})
}
