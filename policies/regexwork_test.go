package policies

import (
	"strings"
	"testing"
)

// mostNamed is the longest text a refusal of checkRegexWork names.
func mostNamed(t *testing.T, err error) int {
	t.Helper()
	const at = "may take at most "
	i := strings.Index(err.Error(), at)
	if i < 0 {
		t.Fatalf("%v; want the refusal to name the longest text", err)
	}
	most := 0
	for _, c := range err.Error()[i+len(at):] {
		if c < '0' || c > '9' {
			break
		}
		most = most*10 + int(c-'0')
	}
	return most
}

// TestRegexWorkSaysWhatWouldDo: a regex call refused for its work names the longest text its
// pattern may take, and that text is then taken.
func TestRegexWorkSaysWhatWouldDo(t *testing.T) {
	for _, all := range []bool{false, true} {
		err := checkRegexWork(`\s+`, strings.Repeat("a ", 1<<24), all)
		if err == nil {
			t.Fatalf("all %v: 32 MiB of text taken", all)
		}
		// Matches everywhere: the bound whatever the matches, for the all-match builtins.
		most := mostNamed(t, err)
		if err := checkRegexWork(`\s+`, strings.Repeat("a ", most/2+1)[:most], all); err != nil {
			t.Errorf("all %v: a text of the %d bytes named: %v", all, most, err)
		}
		if err := checkRegexWork(`\s+`, strings.Repeat("a ", most/2+1)[:most+1], all); err == nil {
			t.Errorf("all %v: a text of %d bytes, one past the %d named, is taken", all, most+1, most)
		}
	}
}

// TestRegexWorkCountsMatches: an all-match builtin (regex.replace, split, find_n) on a long
// text is taken when its matches are few enough for its searches to stay within the work
// bound (a PATH of 20 KiB split on its colons, 512 KiB searched for its flags), and
// refused, saying why, when they are not (".*b|a" over a's: a search to the end of the text
// for each a).
func TestRegexWorkCountsMatches(t *testing.T) {
	path := strings.Repeat("/opt/toolchains/some-vendor/release-2026.11/bin:", 100) // 20 KiB
	if err := checkRegexWork(`:`, path, true); err != nil {
		t.Errorf("a 20 KiB PATH split on its colons: %v", err)
	}
	long := strings.Repeat("python3 -c 'print(6*7)' ", 512<<10/24) + "--token=abc"
	if err := checkRegexWork(`--[a-z-]+=\S+`, long, true); err != nil {
		t.Errorf("a 512 KiB command line's flags: %v", err)
	}
	err := checkRegexWork(`.*b|a`, strings.Repeat("a", 16<<10), true)
	if err == nil || !strings.Contains(err.Error(), "whatever its matches, as this builtin searches again after each match") {
		t.Fatalf(".*b|a over 16 KiB of a's: %v; want it refused, saying why", err)
	}
	if most := mostNamed(t, err); checkRegexWork(`.*b|a`, strings.Repeat("a", most), true) != nil {
		t.Errorf(".*b|a over the %d a's named is refused", most)
	}
	// An empty match after each match makes two searches a match: still counted within the bound.
	if err := checkRegexWork(`a*`, strings.Repeat("ab", 8<<10), true); err == nil {
		t.Errorf("a* over 16 KiB of ab: taken")
	}
}
