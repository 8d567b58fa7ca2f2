package session

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestOutputBufferKeepsACapAndCountsAll(t *testing.T) {
	b := NewOutputBuffer(10)
	for range 1000 {
		_ = b.Add(ExecChunk{Stream: "stdout", Data: "y\n"})
	}
	_ = b.Add(ExecChunk{Stream: "stderr", Data: "12345678é"}) // é straddles the cap
	_ = b.Add(ExecChunk{Stream: "stderr", Data: "more"})
	var res ExecResult
	b.Fill(&res)
	if res.Stdout != strings.Repeat("y\n", 5) || res.StdoutBytes != 2000 || !res.Truncated {
		t.Fatalf("stdout %q %d truncated %v", res.Stdout, res.StdoutBytes, res.Truncated)
	}
	if res.Stderr != "12345678é" || res.StderrBytes != 14 {
		t.Fatalf("stderr %q %d", res.Stderr, res.StderrBytes)
	}
	b = NewOutputBuffer(9)
	_ = b.Add(ExecChunk{Stream: "stdout", Data: "12345678é"})
	b.Fill(&res)
	if res.Stdout != "12345678" || !utf8.ValidString(res.Stdout) || res.StdoutBytes != 10 || !res.Truncated {
		t.Fatalf("cut inside a rune: %q %d", res.Stdout, res.StdoutBytes)
	}
	b = NewOutputBuffer(0)
	_ = b.Add(ExecChunk{Stream: "stdout", Data: "ok"})
	b.Fill(&res)
	if res.Truncated || res.Stdout != "ok" || res.StdoutBytes != 2 || res.Stderr != "" || res.StderrBytes != 0 {
		t.Fatalf("%+v", res)
	}
}
