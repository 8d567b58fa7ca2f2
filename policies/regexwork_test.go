package policies

import (
	"strings"
	"testing"
)

// TestRegexWorkSaysWhatWouldDo: a regex call refused for its work names the longest text its
// pattern may take, and that text is then taken.
func TestRegexWorkSaysWhatWouldDo(t *testing.T) {
	for _, all := range []bool{false, true} {
		insts := regexInsts(`\s+`)
		err := checkRegexWork(insts, strings.Repeat("a ", 1<<24), all)
		var most int
		if err == nil || !strings.Contains(err.Error(), "may take at most ") {
			t.Fatalf("all %v: %v; want the refusal to name the longest text", all, err)
		}
		rest := err.Error()[strings.Index(err.Error(), "may take at most ")+len("may take at most "):]
		for _, c := range rest {
			if c < '0' || c > '9' {
				break
			}
			most = most*10 + int(c-'0')
		}
		if err := checkRegexWork(insts, strings.Repeat("a", most), all); err != nil {
			t.Errorf("all %v: a text of the %d bytes named: %v", all, most, err)
		}
		if err := checkRegexWork(insts, strings.Repeat("a", most+1), all); err == nil {
			t.Errorf("all %v: a text of %d bytes, one past the %d named, is taken", all, most+1, most)
		}
		if all != strings.Contains(err.Error(), "searches again after each match") {
			t.Errorf("all %v: %v", all, err)
		}
	}
}
