package agent

import (
	"bytes"
	"testing"
)

// TestReadStatus: a direct guest's status is the last line of what its stdin carried back,
// "x" and a code of 0-255; anything else (none, a bad line last, a code out of range, a
// line cut short) is DirectNoStatus. A guest's process may write there too.
func TestReadStatus(t *testing.T) {
	for in, want := range map[string]int{
		"x0\n":             0,
		"x7\n":             7,
		"junk\nx255\n":     255,
		"x3\nlater junk\n": DirectNoStatus,
		"x3":               DirectNoStatus,
		"x256\n":           DirectNoStatus,
		"x-1\n":            DirectNoStatus,
		"":                 DirectNoStatus,
		"\n":               DirectNoStatus,
		"y1\n":             DirectNoStatus,
		string(bytes.Repeat([]byte("a"), 100000)) + "\nx9\n": 9,
	} {
		if got := readStatus(bytes.NewReader([]byte(in))); got != want {
			t.Errorf("readStatus(%.40q) = %d, want %d", in, got, want)
		}
	}
}

// FuzzReadStatus: whatever a guest writes back, readStatus answers a code of 0-255 or
// DirectNoStatus, and never panics.
func FuzzReadStatus(f *testing.F) {
	f.Add([]byte("x0\n"))
	f.Add([]byte("junk\nx12\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c := readStatus(bytes.NewReader(b)); c < 0 || c > 255 {
			t.Fatalf("readStatus(%q) = %d", b, c)
		}
	})
}
