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

// regexWork wraps est (nil: none) with the work check of a pattern (operand pattern) on a
// text (operand text); all: the builtin searches again after each match.
func regexWork(pattern, text int, all bool, est sizeFunc) sizeFunc {
	return func(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
		if err := checkRegexWork(regexInsts(str(ops, pattern)), str(ops, text), all); err != nil {
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
	return 0, checkRegexWork(regexInsts(pattern), str(ops, 1), false)
}

func checkRegexWork(insts int64, text string, all bool) error {
	n := int64(len(text)) + 1
	work := insts * n
	if all && work <= maxRegexWork {
		work *= n
	}
	if work <= maxRegexWork {
		return nil
	}
	// The longest text this pattern may take, so that the message says what would do.
	most, why := maxRegexWork/max(insts, 1), ""
	if all {
		most, why = int64(math.Sqrt(float64(most))), ", as this builtin searches again after each match"
	}
	return fmt.Errorf("a pattern of %d instructions on %d bytes of text is too much work for one call "+
		"(this pattern may take at most %d bytes here%s): use a shorter text or a simpler pattern",
		insts, len(text), max(most-1, 0), why)
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
