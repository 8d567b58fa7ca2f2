package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"wb/session"
)

// TestEgressRestartKeepsItsCount: a guest's egress proxy is replaced when the guest is (a
// memory snapshot's restore): the bytes the old one counted since the last usage sample are
// the new one's to report, where they were lost (a review found seconds of uploads going
// unbilled at each snapshot).
func TestEgressRestartKeepsItsCount(t *testing.T) {
	dir, err := os.MkdirTemp("", "wb-egress-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	n := &Node{Config: Config{Logger: slog.New(slog.DiscardHandler), DataDir: dir}}
	l := &live{g: &guest{GuestID: "g-1", SessionID: "sess_1", State: session.Running}}
	if err := os.MkdirAll(filepath.Join(n.guestDir("g-1"), "agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	n.startEgress(l)
	if l.egress == nil {
		t.Fatal("no egress proxy")
	}
	t.Cleanup(l.stopEgress)
	l.egress.bytes.Add(1234) // counted after the last sample
	n.startEgress(l)
	if got := l.egress.bytes.Load(); got != 1234 {
		t.Errorf("the new proxy reports %d bytes, want the old one's 1234", got)
	}
}
