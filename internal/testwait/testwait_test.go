package testwait

import (
	"flag"
	"fmt"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf records the message and stops the goroutine.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	panic(r)
}

func TestFor(t *testing.T) {
	n := 0
	For(t, time.Minute, "the third look", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("looked %d times, want 3", n)
	}
	r := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		For(r, 20*time.Millisecond, "never", func() bool { return false })
	}()
	if r.msg != "waited 20ms for never" {
		t.Fatalf("the failure says %q; want it to name the limit and what it waited for", r.msg)
	}
}

// TestParallel: Parallel sets -parallel when the command line did not, and leaves a value that
// was given (here, set by its first call) alone.
func TestParallel(t *testing.T) {
	f := flag.Lookup("test.parallel")
	was, wasGiven := f.Value.String(), false
	flag.Visit(func(g *flag.Flag) { wasGiven = wasGiven || g == f })
	if wasGiven {
		t.Skip("-parallel was given on the command line")
	}
	t.Cleanup(func() { _ = f.Value.Set(was) })
	Parallel(13)
	if got := f.Value.String(); got != "13" {
		t.Fatalf("-parallel %s after Parallel(13), want 13", got)
	}
	Parallel(7)
	if got := f.Value.String(); got != "13" {
		t.Fatalf("-parallel %s after Parallel(7) once it was set, want 13 kept", got)
	}
}
