package policies

import (
	"fmt"
	"math"
	"regexp"
	"regexp/syntax"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Go's regular expressions run in time linear in the text, but that time is the text's length
// times the compiled pattern's size (thousands of "a?" make an automaton of thousands of
// states, each stepped for every byte), and a builtin that answers every match searches again
// after each one, each search possibly scanning to the end of the text (".*b|a" over a text of
// a's), so its time is the square of the text's length times the pattern's size. None of
// them looks at the evaluation's deadline inside one call: such a call held a decision (and
// a CPU) for seconds to minutes. So a regex builtin whose work could exceed maxRegexWork
// steps is refused before it runs.

// maxRegexWork bounds one regex builtin call's steps (pattern instructions times bytes of
// text, times the searches for the builtins that answer every match): about a tenth of a
// second to a second of one CPU.
const maxRegexWork = 1 << 26

// maxMatchCount bounds the work of counting an all-match builtin's matches before it runs
// (checkRegexWork), which a call refused after all has spent for nothing: a quarter of
// maxRegexWork (about 2 s under the race detector, where maxRegexWork's whole took 8 s).
const maxMatchCount = maxRegexWork / 4

// regexWork wraps est (nil: none) with the work check of a pattern (operand pattern) on a
// text (operand text); all: the builtin searches again after each match.
func regexWork(pattern, text int, all bool, est sizeFunc) sizeFunc {
	return func(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
		if err := checkRegexWork(str(ops, pattern), str(ops, text), all); err != nil {
			return 0, err
		}
		if est == nil {
			return 0, nil
		}
		return est(ops, limit, stop)
	}
}

// estimateTemplateMatch checks regex.template_match's work: its pattern is made of the
// template (its literal parts quoted, its delimited parts as they are).
func estimateTemplateMatch(ops []*ast.Term, _ int64, _ func() bool) (int64, error) {
	tpl, start, end := str(ops, 0), str(ops, 2), str(ops, 3)
	if len(start) != 1 || len(end) != 1 {
		return 0, nil // the builtin reports it
	}
	pattern, ok := templatePattern(tpl, start[0], end[0])
	if !ok {
		return 0, nil // the builtin reports it
	}
	return 0, checkRegexWork(pattern, str(ops, 1), false)
}

// checkRegexWork refuses a call of pattern on text whose work could pass maxRegexWork. One
// search costs at most the pattern's instructions times the text's bytes. A builtin that
// answers every match (all) makes a search per match: with a long text it is refused unless
// counting its matches first, within maxMatchCount, finds few enough that its own searches
// stay within that too (a command line of some kilobytes split on its spaces, or a megabyte
// searched for a few flags, is taken; ".*b|a" over a text of a's is not). A search is
// counted as reading the whole text, as ".*b" does: a pattern that matches often on a long
// text is refused although its searches are short.
func checkRegexWork(pattern, text string, all bool) error {
	insts := regexInsts(pattern)
	n := int64(len(text)) + 1
	search := insts * n
	if search <= maxRegexWork && (!all || search*n <= maxRegexWork || fewMatches(pattern, text, maxMatchCount/max(search, 1))) {
		return nil
	}
	// The longest text this pattern may take, so that the message says what would do.
	insts = max(insts, 1)
	if !all {
		return fmt.Errorf("a pattern of %d instructions on %d bytes of text is too much work for one call "+
			"(this pattern may take at most %d bytes here): use a shorter text or a simpler pattern",
			insts, len(text), maxRegexWork/insts-1)
	}
	return fmt.Errorf("a pattern of %d instructions on %d bytes of text is too much work for one call "+
		"(this pattern may take at most %d bytes here whatever its matches, as this builtin searches again "+
		"after each match, and up to %d when it matches seldom): use a shorter text or a simpler pattern",
		insts, len(text), int64(math.Sqrt(float64(maxRegexWork/insts)))-1, maxMatchCount/insts-1)
}

// fewMatches reports whether pattern matches text few enough times, as the all-match
// builtins find matches (regexp's FindAll), for their searches to be at most searches. For
// m matches FindAll makes at most 2m+1 searches (one for each match, one for each empty match
// right after a match, which it skips, and the last, which finds none), and at most 2k-1 when
// asked for k at most: so counting up to k = (searches+1)/2 costs at most searches searches,
// and with fewer than k found, so does the builtin.
func fewMatches(pattern, text string, searches int64) bool {
	k := (searches + 1) / 2
	if k < 1 {
		return false
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return true // the builtin reports it
	}
	return int64(len(re.FindAllStringIndex(text, int(min(k, 1<<30))))) < k
}

// regexInsts answers the size of pattern's compiled program, as regexp compiles it (0 for a
// pattern that does not compile: the builtin reports it).
func regexInsts(pattern string) int64 {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0
	}
	return int64(len(prog.Inst))
}

// templatePattern is the regular expression regex.template_match makes of tpl (OPA's
// generateRegexTemplate): ok is false when the delimiters do not balance.
func templatePattern(tpl string, start, end byte) (string, bool) {
	var b strings.Builder
	b.WriteByte('^')
	level, from, last := 0, 0, 0
	for i := range len(tpl) {
		switch tpl[i] {
		case start:
			if level++; level == 1 {
				from = i
			}
		case end:
			if level--; level == 0 {
				fmt.Fprintf(&b, "%s(%s)", regexp.QuoteMeta(tpl[last:from]), tpl[from+1:i])
				last = i + 1
			} else if level < 0 {
				return "", false
			}
		}
	}
	if level != 0 {
		return "", false
	}
	b.WriteString(regexp.QuoteMeta(tpl[last:]))
	b.WriteByte('$')
	return b.String(), true
}
