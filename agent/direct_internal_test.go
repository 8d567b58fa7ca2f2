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
		string(bytes.Repeat([]byte("a"), 4000)) + "\nx9\n": 9,
	} {
		if got, _ := readStatus(bytes.NewReader([]byte(in))); got != want {
			t.Errorf("readStatus(%.40q) = %d, want %d", in, got, want)
		}
	}
}

// TestReadStatusBounded: a guest that writes on and on where its status goes is read
// directCtrlMax bytes at most, and answered over (the exec then ends the guest).
func TestReadStatusBounded(t *testing.T) {
	r := &endless{}
	code, over := readStatus(r)
	if !over || code != DirectNoStatus || r.n > directCtrlMax+512 {
		t.Errorf("readStatus of an endless writer: code %d, over %v, %d bytes read; want over, %d, at most %d", code, over, r.n, DirectNoStatus, directCtrlMax+512)
	}
}

// endless is a reader that never ends, counting what it gave.
type endless struct{ n int }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	e.n += len(p)
	return len(p), nil
}

// FuzzReadStatus: whatever a guest writes back, readStatus answers a code of 0-255 or
// DirectNoStatus, and never panics.
func FuzzReadStatus(f *testing.F) {
	f.Add([]byte("x0\n"))
	f.Add([]byte("junk\nx12\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, _ := readStatus(bytes.NewReader(b)); c < 0 || c > 255 {
			t.Fatalf("readStatus(%q) = %d", b, c)
		}
	})
}
