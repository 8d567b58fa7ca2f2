package oci

import (
	"reflect"
	"testing"

	"wb/hypervisor"
)

// TestParseProcessTable: runsc ps's table read into pids and names; a name is the guest's
// to choose (spaces, a newline that forges a line of its own): no line panics, and one that
// does not parse is skipped.
func TestParseProcessTable(t *testing.T) {
	table := "UID       PID       PPID      C         TTY       STIME     TIME      CMD\n" +
		"0         1         0         0         ?         21:48     10ms      python3\n" +
		"0         2         1         0         ?         21:48     0s        my prog\n" +
		"0         3         1         0         ?         21:48     0s        a\n" +
		"b\n" +
		"0         x         1         0         ?         21:48     0s        bad-pid\n" +
		"0         -4        1         0         ?         21:48     0s        negative\n" +
		"0 5\n" +
		"\n"
	got := parseProcessTable(table)
	want := []hypervisor.GuestProcess{{PID: 1, Name: "python3"}, {PID: 2, Name: "my prog"}, {PID: 3, Name: "a"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "\n", "PID\n1\n", "UID PID PPID C TTY STIME TIME NAME\n0 1 0 0 ? 0 0 x\n"} {
		if got := parseProcessTable(bad); len(got) != 0 {
			t.Errorf("table %q: %+v, want nothing", bad, got)
		}
	}
}

// FuzzParseProcessTable: whatever the runtime printed (a guest's process names included),
// the parse never panics and answers only positive pids.
func FuzzParseProcessTable(f *testing.F) {
	f.Add("UID PID PPID C TTY STIME TIME CMD\n0 1 0 0 ? 21:48 10ms python3\n")
	f.Add("UID PID PPID C TTY STIME TIME CMD\n0 1 0 0 ? 21:48 10ms a\nb c\n")
	f.Fuzz(func(t *testing.T, table string) {
		for _, p := range parseProcessTable(table) {
			if p.PID <= 0 {
				t.Fatalf("pid %d from %q", p.PID, table)
			}
		}
	})
}
