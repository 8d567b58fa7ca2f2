package logbudget

import (
	"testing"
	"time"
)

// TestTake: Burst lines at once, then Rate a second; keys are apart; the first drop is noted
// at once, the next ones together after NoteEvery.
func TestTake(t *testing.T) {
	var b Budget
	t0 := time.Unix(1700000000, 0)
	for i := range Burst {
		if ok, note := b.Take("a", t0); !ok || note != 0 {
			t.Fatalf("line %d of the burst: %v, note %d", i+1, ok, note)
		}
	}
	if ok, note := b.Take("a", t0); ok || note != 1 {
		t.Fatalf("a line past the burst: %v, note %d; want dropped, noted at once", ok, note)
	}
	if ok, _ := b.Take("b", t0); !ok {
		t.Fatal("another key's first line was dropped")
	}
	for i := range 5 {
		if ok, note := b.Take("a", t0.Add(time.Duration(i)*time.Millisecond)); ok || note != 0 {
			t.Fatalf("drop %d: %v, note %d", i, ok, note)
		}
	}
	kept := 0
	for i := range 10 * Rate {
		if ok, _ := b.Take("a", t0.Add(time.Second+time.Duration(i)*time.Microsecond)); ok {
			kept++
		}
	}
	if kept < Rate-1 || kept > Rate+1 {
		t.Errorf("a second later %d lines kept, want about %d", kept, Rate)
	}
	if _, note := b.Take("a", t0.Add(NoteEvery+time.Second)); note < 5 {
		t.Errorf("after NoteEvery the note counts %d drops, want at least 5", note)
	}
}
