package session

import "unicode/utf8"

// DefaultMaxOutputBytes is how much of each stream (stdout, stderr) a buffered exec or run
// keeps: 8 MiB. Past it the output is read and counted but dropped, and the result says
// "truncated": true with the full byte counts. Streams (NDJSON, PTY) are not capped.
const DefaultMaxOutputBytes = 8 << 20

// OutputBuffer collects a command's output for a buffered result, keeping at most max bytes
// of each stream; memory stays flat however much the command writes.
type OutputBuffer struct {
	max            int
	stdout, stderr []byte
	outN, errN     int64
}

// NewOutputBuffer keeps up to max bytes per stream (DefaultMaxOutputBytes when max <= 0).
func NewOutputBuffer(max int) *OutputBuffer {
	if max <= 0 {
		max = DefaultMaxOutputBytes
	}
	return &OutputBuffer{max: max}
}

// Add takes one chunk (the raw bytes in Data); it never fails.
func (b *OutputBuffer) Add(c ExecChunk) error {
	dst, n := &b.stdout, &b.outN
	if c.Stream == "stderr" {
		dst, n = &b.stderr, &b.errN
	}
	*n += int64(len(c.Data))
	if room := b.max - len(*dst); room > 0 {
		*dst = append(*dst, CutOutput(c.Data, room)...)
	}
	return nil
}

// CutOutput returns at most n bytes of s, less the start of a UTF-8 sequence the cut would
// split, so that text stays text (binary output is cut at n, give or take 3 bytes).
func CutOutput(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:max(n, 0)]
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				s = s[:i]
			}
			break
		}
	}
	return s
}

// Fill puts what was kept, the byte counts and whether anything was dropped into res.
func (b *OutputBuffer) Fill(res *ExecResult) {
	res.Stdout, res.Stderr = string(b.stdout), string(b.stderr)
	res.StdoutBytes, res.StderrBytes = b.outN, b.errN
	res.Truncated = b.outN > int64(len(b.stdout)) || b.errN > int64(len(b.stderr))
}
