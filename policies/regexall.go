package policies

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"regexp/syntax"
	"strings"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/builtins"
)

// The builtins that answer every match (regex.split, regex.find_n,
// regex.find_all_string_submatch_n, regex.replace) were bounded by their worst case, each
// search counted as reading to the end of the text: a pattern that matches often on a long
// text (a 20 KiB command line split on its spaces, a 64 KiB CSV line's commas replaced) was
// refused although its searches are short. Go's regexp reads an io.RuneReader only as far as
// a search needs, with its NFA (each rune read costs at most the program's instructions),
// and a pattern without empty-width assertions (^, $, \A, \z, \b, \B) matches from an
// offset of a text exactly as in the text that starts there. So for such a pattern, when its
// worst case passes maxRegexWork, these builtins run here, FindAll's loop over searches of
// readers that count the runes read: the call stops once their work passes maxRegexAllWork (or
// at the evaluation's deadline) and is refused, as before, when it does. Patterns with
// assertions, whose search from an offset needs the text before it, keep the worst-case rule
// (checkRegexWork); a large one (over maxOPACachedInsts) is still searched here, by regexp's
// FindAll over the whole text, so that it is not left in OPA's process-wide cache.

// maxRegexAllWork bounds the work of an all-match builtin's searches run here (regexAll): a
// call refused has spent it for nothing, so it is a quarter of maxRegexWork, as maxMatchCount.
const maxRegexAllWork = maxRegexWork / 4

// searchWork is what one search costs besides the runes it reads, in the units of
// maxRegexAllWork: a matcher taken from regexp's pool and set up, a reader, the answer
// allocated and delivered. Uncounted, an empty pattern's searches over 4 MiB (two runes
// each) were refused after 5 times the time of ".*b|a" on 40 KiB of a's, for the same work.
const searchWork = 64

// contextFree reports whether re has no empty-width assertion: whether it matches from an
// offset of a text as it does in the text that starts there.
func contextFree(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText,
		syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return false
	}
	for _, s := range re.Sub {
		if !contextFree(s) {
			return false
		}
	}
	return true
}

// errWorkSpent is what a workReader answers once its call's work is spent: the search sees
// the end of its text, and its answer is discarded.
var errWorkSpent = errors.New("regex work spent")

// workReader reads text to regexp's NFA as strings.Reader does (an invalid byte is
// utf8.RuneError of width 1, as regexp's string input steps), charging each read to its
// call's work.
type workReader struct {
	text string
	pos  int
	work *regexAll
}

func (r *workReader) ReadRune() (rune, int, error) {
	if !r.work.charge() {
		return 0, 0, errWorkSpent
	}
	if r.pos >= len(r.text) {
		return 0, 0, io.EOF
	}
	if c := r.text[r.pos]; c < utf8.RuneSelf {
		r.pos++
		return rune(c), 1, nil
	}
	c, w := utf8.DecodeRuneInString(r.text[r.pos:])
	r.pos += w
	return c, w, nil
}

// regexAll runs a context-free pattern's searches over one text, within maxRegexAllWork.
type regexAll struct {
	re     *regexp.Regexp
	text   string
	groups bool   // the searches answer the groups' positions
	prefix string // what every match starts with (regexp's LiteralPrefix)
	insts  int64  // the pattern's instructions
	cost   int64  // one rune read's work: the instructions, times the groups plus one with groups
	// groupsNote says, in a refusal, that the groups were counted.
	groupsNote string
	// single: one search (regex.match), not a search again after each match.
	single bool
	// whole: the searches run uncounted, as regexp's FindAll over the whole text: a pattern
	// with assertions whose worst case fits the bound (regexAllOf).
	whole bool
	left  int64
	// unchecked is the work spent since the deadline was last looked at (every
	// deadlineWork): by work, not by reads, as one read of a large pattern is long.
	unchecked int64
	stop      func() bool
	err       error
}

// deadlineWork is the work between two looks at the evaluation's deadline: a few
// milliseconds, a 256th of maxRegexWork.
const deadlineWork = maxRegexWork / 256

// charge counts one rune read, answering false (and setting err) once the work is spent or
// the evaluation's deadline has passed.
func (a *regexAll) charge() bool {
	return a.spend(a.cost)
}

// spend counts work, answering false (and setting err) once the call's is spent or the
// evaluation's deadline has passed.
func (a *regexAll) spend(work int64) bool {
	if a.err != nil {
		return false
	}
	if a.left -= work; a.left < 0 && a.single {
		a.err = fmt.Errorf("a pattern of %d instructions on %d bytes of text is too much work for one call "+
			"(its search would read more than %d runes of the text): use a shorter text or a simpler pattern",
			a.insts, len(a.text), maxRegexWork/a.cost)
		return false
	} else if a.left < 0 {
		a.err = fmt.Errorf("a pattern of %d instructions on %d bytes of text is too much work for one call "+
			"(its searches, as this builtin searches again after each match, would read more than %d runes of the text "+
			"or number more than %d%s): use a shorter text or a simpler pattern",
			a.insts, len(a.text), maxRegexAllWork/a.cost, maxRegexAllWork/searchWork, a.groupsNote)
		return false
	}
	if a.unchecked += work; a.unchecked >= deadlineWork {
		a.unchecked = 0
		if a.stop() {
			a.err = errTimedOut
			return false
		}
	}
	return true
}

var errTimedOut = errors.New("timed out")

// find answers the leftmost match at or after pos, as regexp's search from pos in the whole
// text does (nil: none), with the groups' positions if a.groups; or nil, setting a.err, when
// the work is spent.
func (a *regexAll) find(pos int) []int {
	if !a.spend(searchWork) {
		return nil
	}
	// Every match starts with the literal prefix: the search starts at its next occurrence,
	// as regexp's does.
	if a.prefix != "" {
		i := strings.Index(a.text[pos:], a.prefix)
		if i < 0 {
			return nil
		}
		pos += i
	}
	r := &workReader{text: a.text[pos:], work: a}
	var loc []int
	if a.groups {
		loc = a.re.FindReaderSubmatchIndex(r)
	} else {
		loc = a.re.FindReaderIndex(r)
	}
	if a.err != nil {
		return nil
	}
	for i, p := range loc {
		if p >= 0 {
			loc[i] = p + pos
		}
	}
	return loc
}

// each delivers up to n matches (all when n < 0) as regexp's FindAll does (its allMatches):
// after an empty match the next search starts a rune further, and an empty match right after
// the previous match is skipped.
func (a *regexAll) each(n int, deliver func(loc []int)) error {
	if a.whole {
		var locs [][]int
		if a.groups {
			locs = a.re.FindAllStringSubmatchIndex(a.text, n)
		} else {
			locs = a.re.FindAllStringIndex(a.text, n)
		}
		for _, loc := range locs {
			deliver(loc)
		}
		return nil
	}
	end := len(a.text)
	if n < 0 {
		n = end + 1
	}
	for pos, i, prevEnd := 0, 0, -1; i < n && pos <= end; {
		loc := a.find(pos)
		if a.err != nil {
			return a.err
		}
		if loc == nil {
			break
		}
		accept := true
		if loc[1] == pos {
			if loc[0] == prevEnd {
				accept = false
			}
			if pos < end {
				_, w := utf8.DecodeRuneInString(a.text[pos:])
				pos += w
			} else {
				pos = end + 1
			}
		} else {
			pos = loc[1]
		}
		prevEnd = loc[1]
		if accept {
			deliver(loc)
			i++
		}
	}
	return nil
}

// allSearches answers the searches of p over text when they are to run here (nil: OPA's
// builtin runs); groups: they answer the groups' positions; stop: whether the evaluation's
// deadline has passed.
type allSearches func(p *regexProgram, text string, groups bool, stop func() bool) *regexAll

// newRegexAll answers the searches of p over text when the pattern compiles, has no
// assertion, and its worst case passes maxRegexWork (else OPA's builtin runs, within that
// bound).
func newRegexAll(p *regexProgram, text string, groups bool, stop func() bool) *regexAll {
	return regexAllOf(p, text, groups, stop, false)
}

// measuredRegexAll is newRegexAll whatever the pattern's worst case.
func measuredRegexAll(p *regexProgram, text string, groups bool, stop func() bool) *regexAll {
	return regexAllOf(p, text, groups, stop, true)
}

func regexAllOf(p *regexProgram, text string, groups bool, stop func() bool, always bool) *regexAll {
	if p.err != nil || p.insts == 0 {
		return nil
	}
	insts, caps := p.insts, p.caps
	// Within the bound whatever its matches: OPA's builtin, whose string search skips ahead
	// to a literal prefix and backtracks on short texts, is faster. It tracks every group's
	// positions (regexProgram.check); these searches only when they are answered.
	left := int64(maxRegexAllWork)
	within := false
	if n, all := int64(len(text))+1, insts*caps; !always && all*n <= maxRegexWork && all*n*n <= maxRegexWork {
		if insts <= maxOPACachedInsts {
			return nil
		}
		within = true
		left = maxRegexWork // what OPA's builtin was allowed: its worst case fits
	}
	// A pattern with assertions cannot be searched from an offset (contextFree); its worst
	// case fits the bound (regexProgram.check refused it otherwise). A large one is still
	// searched here, as regexp's FindAll over the whole text, uncounted as OPA's builtin is,
	// so that its compiled program goes with the evaluation rather than into OPA's cache.
	whole := !p.free
	if whole && (!within || always) {
		return nil
	}
	cost := insts
	if groups {
		cost *= caps
	}
	re := p.compiled()
	if re == nil {
		return nil
	}
	prefix, _ := re.LiteralPrefix()
	a := &regexAll{re: re, prefix: prefix, text: text, groups: groups, whole: whole, insts: insts, cost: cost, left: left, stop: stop}
	if groups && caps > 1 {
		a.groupsNote = fmt.Sprintf(", its instructions counted once for each of its %d groups and once for the match, "+
			"as this builtin tracks their positions", caps-1)
	}
	return a
}

// regexAllReplacement answers wb's implementation of the all-match builtin name (nil: name is
// not one), which runs OPA's for the calls it does not take.
func regexAllReplacement(name string) topdown.BuiltinFunc {
	var wrap func(orig topdown.BuiltinFunc, take allSearches) topdown.BuiltinFunc
	switch name {
	case ast.RegexSplit.Name:
		wrap = regexSplit
	case ast.RegexFind.Name:
		wrap = regexFindN
	case ast.RegexFindAllStringSubmatch.Name:
		wrap = regexFindAllSubmatch
	case ast.RegexReplace.Name:
		wrap = regexReplace
	default:
		return nil
	}
	if orig := topdown.GetBuiltin(name); orig != nil {
		return wrap(orig, newRegexAll)
	}
	return nil
}

// searchesOf checks the work of an all-match builtin's pattern on text, with the
// pattern made once for the evaluation (regexCacheOf), and answers its counted searches
// (nil: OPA's builtin runs), or the refusal.
func searchesOf(bctx topdown.BuiltinContext, pattern, text string, groups bool, take allSearches) (*regexAll, *regexProgram, error) {
	p := regexCacheOf(bctx.Context).program(pattern)
	if err := p.check(text, true, true); err != nil {
		return nil, p, halted(err)
	}
	return take(p, text, groups, stopOf(bctx)), p, nil
}

// stopOf answers whether bctx's evaluation is cancelled (its deadline passed).
func stopOf(bctx topdown.BuiltinContext) func() bool {
	return func() bool { return bctx.Cancel != nil && bctx.Cancel.Cancelled() }
}

// halted is a refusal stopping the evaluation, as a refused estimate does (OPA prefixes it
// with the builtin's name).
func halted(err error) error {
	return topdown.Halt{Err: err}
}

// stringOps answers operands' first n strings, ok false when one is not (OPA's builtin
// reports it).
func stringOps(operands []*ast.Term, n int) ([]string, bool) {
	out := make([]string, n)
	for i := range n {
		s, err := builtins.StringOperand(operands[i].Value, i+1)
		if err != nil {
			return nil, false
		}
		out[i] = string(s)
	}
	return out, true
}

// regexSplit is regex.split(pattern, text): regexp's Split(text, -1).
func regexSplit(orig topdown.BuiltinFunc, take allSearches) topdown.BuiltinFunc {
	return func(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error) error {
		ops, ok := stringOps(operands, 2)
		if !ok {
			return orig(bctx, operands, iter)
		}
		pattern, s := ops[0], ops[1]
		a, _, err := searchesOf(bctx, pattern, s, false, take)
		if err != nil {
			return err
		}
		if a == nil {
			return orig(bctx, operands, iter)
		}
		if len(pattern) > 0 && len(s) == 0 {
			return iter(ast.ArrayTerm(ast.StringTerm("")))
		}
		var pieces []*ast.Term
		beg, end := 0, 0
		err = a.each(-1, func(loc []int) {
			end = loc[0]
			if loc[1] != 0 {
				pieces = append(pieces, ast.StringTerm(s[beg:end]))
			}
			beg = loc[1]
		})
		if err != nil {
			return halted(err)
		}
		if end != len(s) {
			pieces = append(pieces, ast.StringTerm(s[beg:]))
		}
		return iter(ast.ArrayTerm(pieces...))
	}
}

// findNOperands reads the operands (pattern, text, n) of find_n and
// find_all_string_submatch_n, checks their work and takes their counted searches: a
// nil when OPA's builtin must answer (an operand of another type, or searches the counted
// path does not take).
func findNOperands(bctx topdown.BuiltinContext, operands []*ast.Term, take allSearches, groups bool) (*regexAll, string, int, error) {
	ops, ok := stringOps(operands, 2)
	if !ok {
		return nil, "", 0, nil
	}
	n, err := builtins.IntOperand(operands[2].Value, 3)
	if err != nil {
		return nil, "", 0, nil
	}
	a, _, err := searchesOf(bctx, ops[0], ops[1], groups, take)
	return a, ops[1], n, err
}

// regexFindN is regex.find_n(pattern, text, n): regexp's FindAllString(text, n).
func regexFindN(orig topdown.BuiltinFunc, take allSearches) topdown.BuiltinFunc {
	return func(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error) error {
		a, s, n, err := findNOperands(bctx, operands, take, false)
		if err != nil {
			return err
		}
		if a == nil {
			return orig(bctx, operands, iter)
		}
		var found []*ast.Term
		if err := a.each(n, func(loc []int) { found = append(found, ast.StringTerm(s[loc[0]:loc[1]])) }); err != nil {
			return halted(err)
		}
		return iter(ast.ArrayTerm(found...))
	}
}

// regexFindAllSubmatch is regex.find_all_string_submatch_n(pattern, text, n): regexp's
// FindAllStringSubmatch(text, n), a group that did not take part as "".
func regexFindAllSubmatch(orig topdown.BuiltinFunc, take allSearches) topdown.BuiltinFunc {
	return func(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error) error {
		a, s, n, err := findNOperands(bctx, operands, take, true)
		if err != nil {
			return err
		}
		if a == nil {
			return orig(bctx, operands, iter)
		}
		groups := a.re.NumSubexp() + 1
		var found []*ast.Term
		err = a.each(n, func(loc []int) {
			inner := make([]*ast.Term, groups)
			for j := range inner {
				if loc[2*j] >= 0 {
					inner[j] = ast.StringTerm(s[loc[2*j]:loc[2*j+1]])
				} else {
					inner[j] = ast.StringTerm("")
				}
			}
			found = append(found, ast.ArrayTerm(inner...))
		})
		if err != nil {
			return halted(err)
		}
		return iter(ast.ArrayTerm(found...))
	}
}

// regexReplace is regex.replace(text, pattern, value): each match replaced by value expanded
// ($1, ${name}), an empty match right after a match left alone, as regexp's
// ReplaceAllString does; the text's own term when nothing changed, as OPA answers.
func regexReplace(orig topdown.BuiltinFunc, take allSearches) topdown.BuiltinFunc {
	return func(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error) error {
		ops, ok := stringOps(operands, 3)
		if !ok {
			return orig(bctx, operands, iter)
		}
		s, value := ops[0], ops[2]
		a, p, err := searchesOf(bctx, ops[1], s, dollarIn(2)(operands), take)
		if err != nil {
			return err
		}
		if err := checkRegexExpand(value, s, p.caps); err != nil {
			return halted(err)
		}
		if a == nil {
			return orig(bctx, operands, iter)
		}
		var out []byte
		last := 0
		err = a.each(-1, func(loc []int) {
			out = append(out, s[last:loc[0]]...)
			out = a.re.ExpandString(out, value, s, loc)
			last = loc[1]
		})
		if err != nil {
			return halted(err)
		}
		out = append(out, s[last:]...)
		if string(out) == s {
			return iter(operands[0])
		}
		return iter(ast.InternedTerm(string(out)))
	}
}
