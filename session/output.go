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
		part := c.Data
		if len(part) > room {
			part = part[:room]
			// Do not keep half a UTF-8 sequence at the cut.
			for i := len(part) - 1; i >= 0 && i >= len(part)-utf8.UTFMax+1; i-- {
				if utf8.RuneStart(part[i]) {
					if !utf8.FullRuneInString(part[i:]) {
						part = part[:i]
					}
					break
				}
			}
		}
		*dst = append(*dst, part...)
	}
	return nil
}

// Fill puts what was kept, the byte counts and whether anything was dropped into res.
func (b *OutputBuffer) Fill(res *ExecResult) {
	res.Stdout, res.Stderr = string(b.stdout), string(b.stderr)
	res.StdoutBytes, res.StderrBytes = b.outN, b.errN
	res.Truncated = b.outN > int64(len(b.stdout)) || b.errN > int64(len(b.stderr))
}
