package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrentWritesAndReads: writers and readers in several goroutines lose no write
// (run with -race).
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
				_ = b.Bytes()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 800) || len(b.Bytes()) != 800 {
		t.Fatalf("after 800 writes of one byte: %d bytes", len(got))
	}
}
