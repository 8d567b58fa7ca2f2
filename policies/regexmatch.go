package policies

import (
	"fmt"
	"regexp/syntax"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// The builtins that make one search (regex.match, re_match, regex.template_match) were
// refused on their worst case, the pattern's instructions times the text's length, before
// they ran: a list of a few hundred commands matched at a command line's start, or a flag
// looked for in a long text where it comes first, was refused although its search reads a
// few runes. Go's regexp matching an io.RuneReader runs its NFA from the text's start and
// stops at the first match, or once no thread is left (an anchored pattern that failed), so
// when the worst case passes maxRegexWork the search runs here on a workReader, charged
// what it reads: it is refused once that passes maxRegexWork, or at the evaluation's
// deadline. A search from the text's start sees the assertions (^, $, \b) as the string
// search does, so any pattern is taken; one without assertions starts at its literal
// prefix's first occurrence, as regexp's string search skips to it.

// oneSearch answers the counted search of p over text when it is to run here (nil: OPA's
// builtin runs); stop: whether the evaluation's deadline has passed.
type oneSearch func(p *regexProgram, text string, stop func() bool) *regexAll

// newRegexOne answers the counted search of p over text when the pattern compiles and its
// worst case passes maxRegexWork (else OPA's builtin runs, within that bound: its string
// search skips ahead and backtracks, faster than the NFA on a reader).
func newRegexOne(p *regexProgram, text string, stop func() bool) *regexAll {
	return regexOneOf(p, text, stop, false)
}

// measuredRegexOne is newRegexOne whatever the pattern's worst case.
func measuredRegexOne(p *regexProgram, text string, stop func() bool) *regexAll {
	return regexOneOf(p, text, stop, true)
}

func regexOneOf(p *regexProgram, text string, stop func() bool, always bool) *regexAll {
	if p.err != nil || p.insts == 0 {
		return nil // refused, or it does not compile: OPA's builtin reports it
	}
	if !always && p.insts <= maxOPACachedInsts && p.insts*(int64(len(text))+1) <= maxRegexWork {
		return nil
	}
	re := p.compiled()
	if re == nil {
		return nil
	}
	a := &regexAll{re: re, text: text, insts: p.insts, cost: p.insts, left: maxRegexWork, stop: stop, single: true}
	if p.free {
		a.prefix, _ = re.LiteralPrefix()
	}
	return a
}

// searchOf checks a single-search builtin's pattern, made once for the evaluation
// (regexCacheOf), and answers its counted search (nil: OPA's builtin runs), or the refusal.
func searchOf(bctx topdown.BuiltinContext, pattern, text string, take oneSearch) (*regexAll, error) {
	p := regexCacheOf(bctx.Context).program(pattern)
	if p.err != nil {
		return nil, halted(p.err)
	}
	return take(p, text, stopOf(bctx)), nil
}

// match answers whether a's pattern matches its text, reading it through a workReader; or
// a.err once the work is spent or the deadline has passed.
func (a *regexAll) match() (bool, error) {
	text := a.text
	// Every match starts with the literal prefix, and a pattern without assertions matches
	// from an offset as in the text starting there.
	if a.prefix != "" {
		i := strings.Index(text, a.prefix)
		if i < 0 {
			return false, nil
		}
		text = text[i:]
	}
	ok := a.re.MatchReader(&workReader{text: text, work: a})
	if a.err != nil {
		return false, a.err
	}
	return ok, nil
}

// regexOneReplacement answers wb's implementation of the single-search builtin name (nil:
// name is not one), which runs OPA's for the calls it does not take.
func regexOneReplacement(name string) topdown.BuiltinFunc {
	orig := topdown.GetBuiltin(name)
	if orig == nil {
		return nil
	}
	switch name {
	case ast.RegexMatch.Name, ast.RegexMatchDeprecated.Name:
		return regexMatch(orig, newRegexOne)
	case ast.RegexTemplateMatch.Name:
		return regexTemplateMatch(orig, newRegexOne)
	}
	return nil
}

// regexMatch is regex.match(pattern, text) (and re_match): regexp's MatchString.
func regexMatch(orig topdown.BuiltinFunc, take oneSearch) topdown.BuiltinFunc {
	return func(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error) error {
		ops, ok := stringOps(operands, 2)
		if !ok {
			return orig(bctx, operands, iter)
		}
		a, err := searchOf(bctx, ops[0], ops[1], take)
		if err != nil {
			return err
		}
		if a == nil {
			return orig(bctx, operands, iter)
		}
		matched, err := a.match()
		if err != nil {
			return halted(err)
		}
		return iter(ast.InternedTerm(matched))
	}
}

// regexTemplateMatch is regex.template_match(template, text, start, end): the pattern made
// of the template (templatePattern) matched against text. OPA's builtin answers the calls
// whose template it refuses: delimiters not one byte, or not balanced, or a delimited part
// that does not compile alone (OPA compiles each).
func regexTemplateMatch(orig topdown.BuiltinFunc, take oneSearch) topdown.BuiltinFunc {
	return func(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error) error {
		ops, ok := stringOps(operands, 4)
		if !ok || len(ops[2]) != 1 || len(ops[3]) != 1 {
			return orig(bctx, operands, iter)
		}
		tpl, start, end := ops[0], ops[2][0], ops[3][0]
		pattern, ok := templatePattern(tpl, start, end)
		if !ok {
			return orig(bctx, operands, iter)
		}
		p := regexCacheOf(bctx.Context).program(pattern)
		if p.err != nil {
			return halted(p.err)
		}
		// OPA's builtin compiles each delimited part alone before the whole pattern (a part
		// of 3 million instructions took 5 s and 800 MiB there). The pattern's check bounds
		// them when it compiles, as it holds each as written, unless a part's \Q makes what
		// follows it literal there.
		if p.insts == 0 || strings.Contains(tpl, `\Q`) {
			if err := checkTemplateParts(tpl, start, end); err != nil {
				return halted(err)
			}
		}
		if p.insts == 0 {
			return orig(bctx, operands, iter) // it reports the error
		}
		a := take(p, ops[1], stopOf(bctx))
		if a == nil || !templatePartsParse(tpl, start, end) {
			return orig(bctx, operands, iter)
		}
		matched, err := a.match()
		if err != nil {
			return halted(err)
		}
		return iter(ast.InternedTerm(matched))
	}
}

// templatePartsParse reports whether each delimited part of tpl parses alone, as OPA's
// builtin compiles it ("^part$"), which refuses the template when one does not.
func templatePartsParse(tpl string, start, end byte) bool {
	ok := true
	eachTemplatePart(tpl, start, end, func(lo, hi int) bool {
		_, err := syntax.Parse("^"+tpl[lo+1:hi]+"$", syntax.Perl)
		ok = err == nil
		return ok
	})
	return ok
}

// checkTemplateParts refuses tpl when its delimited parts, which OPA's builtin compiles alone
// up to the first that does not compile, are too large to compile together (as one pattern
// is, checkRegexPattern), from their parse trees.
func checkTemplateParts(tpl string, start, end byte) error {
	var insts, runes, classRunes, folded int64
	var err error
	eachTemplatePart(tpl, start, end, func(lo, hi int) bool {
		pattern := "^" + tpl[lo+1:hi] + "$"
		if classRunes += unicodeClassRunes(pattern); classRunes > maxRegexRunes {
			err = unicodeClassesError(classRunes)
			return false
		}
		if folded += foldedClassRunes(pattern); folded > maxRegexFoldRunes {
			err = foldedClassesError(folded)
			return false
		}
		re, perr := syntax.Parse(pattern, syntax.Perl)
		if perr != nil {
			return false // OPA's builtin stops here, and reports it
		}
		n, r := progSize(re)
		if insts, runes = insts+n, runes+r; insts > maxRegexInsts || runes > maxRegexRunes {
			err = fmt.Errorf("a template whose parts, each compiled alone, make about %d instructions and %d runes in their classes "+
				"is too large to compile in one call (at most %d and %d): use a simpler template", insts, runes, maxRegexInsts, maxRegexRunes)
			return false
		}
		return true
	})
	return err
}

// eachTemplatePart calls f with each delimited part of tpl, in order, while f answers true:
// the indexes of its start and end delimiters (the part is tpl[lo+1:hi]). It answers
// false when the delimiters do not balance (an end before its start, or a start left open),
// which OPA's builtin refuses; true when f stopped it.
func eachTemplatePart(tpl string, start, end byte, f func(lo, hi int) bool) (balanced bool) {
	level, from := 0, 0
	for i := range len(tpl) {
		switch tpl[i] {
		case start:
			if level++; level == 1 {
				from = i
			}
		case end:
			if level--; level < 0 {
				return false
			} else if level == 0 && !f(from, i) {
				return true
			}
		}
	}
	return level == 0
}
