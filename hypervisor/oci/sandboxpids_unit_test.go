package oci

import (
	"slices"
	"testing"
)

// TestEventsPidsStartPastHalf: a watch that starts on a sandbox already past half its host
// limit (a node's restart adopting its guests: the count does not fall back once a bomb was
// ended) takes that count for where it is, and reports only as it grows by another eighth.
// Reporting it at once had the new node's agent end every process of a guest that ran no
// bomb, at each restart. Fake cgroup files; the test process stands in for the sandbox.
func TestEventsPidsStartPastHalf(t *testing.T) {
	set, ch := fakePidsWatch(t, RuntimeRunsc, "600") // 60 %, where an ended bomb left it
	got := pidsReported(set, ch, "600", "650", "700", "725", "760")
	want := []string{"725: pids the sandbox's host tasks: pids.current=725 of pids.max=1000 (72%)"}
	if !slices.Equal(got, want) {
		t.Errorf("a watch that started at 600 of 1,000, as the count grew: %q; want %q", got, want)
	}
}
