package node

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBeforeExecResult: the check runs once, before the bytes that complete the result
// line's key are written, however the answer is cut into writes; an output line that quotes
// the key (escaped, as a JSON string must) does not set it off; an answer without a result
// runs it at its end.
func TestBeforeExecResult(t *testing.T) {
	out := `{"stream":"stdout","data":"a guest may print \"exit_code\": 0"}` + "\n"
	answer := out + `{"exit_code":137,"duration_ms":12}` + "\n"
	keyEnd := len(out) + len(`{"exit_code"`)
	cuts := func(size int) [][]byte {
		var ws [][]byte
		for b := []byte(answer); len(b) > 0; b = b[min(size, len(b)):] {
			ws = append(ws, b[:min(size, len(b))])
		}
		return ws
	}
	var plans [][][]byte
	for size := 1; size <= len(answer); size++ {
		plans = append(plans, cuts(size))
	}
	for i := 1; i < len(answer); i++ { // two writes, cut at i
		plans = append(plans, [][]byte{[]byte(answer[:i]), []byte(answer[i:])})
	}
	for _, writes := range plans {
		rec := httptest.NewRecorder()
		calls, at, writeEnd, atWriteEnd := 0, -1, 0, 0
		w := &beforeExecResult{ResponseWriter: rec, check: func() { calls++; at, atWriteEnd = rec.Body.Len(), writeEnd }}
		for _, b := range writes {
			writeEnd = rec.Body.Len() + len(b)
			if _, err := w.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		w.checkOnce()
		// Before the key's last byte is written, by the write that holds it.
		if calls != 1 || at >= keyEnd || atWriteEnd < keyEnd {
			t.Fatalf("writes of %d bytes: %d checks, the last after %d bytes, in a write to byte %d; want one, in the write that ends the key (byte %d), before it",
				len(writes[0]), calls, at, atWriteEnd, keyEnd)
		}
		if rec.Body.String() != answer {
			t.Fatalf("the answer changed: %q", rec.Body.String())
		}
	}
	// No result line: the check runs at the end.
	rec := httptest.NewRecorder()
	calls := 0
	w := &beforeExecResult{ResponseWriter: rec, check: func() { calls++ }}
	_, _ = w.Write([]byte(strings.Repeat(out, 3)))
	if calls != 0 {
		t.Fatal("an output line that quotes the key set the check off")
	}
	w.checkOnce()
	w.checkOnce()
	if calls != 1 || !bytes.Equal(rec.Body.Bytes(), []byte(strings.Repeat(out, 3))) {
		t.Fatalf("%d checks after an answer without a result", calls)
	}
}
