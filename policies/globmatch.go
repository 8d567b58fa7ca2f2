package policies

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"github.com/gobwas/glob"
	"github.com/gobwas/glob/syntax"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/builtins"
)

// OPA's glob.match backtracks: "*{a,b}a" four times over 256 bytes took minutes inside one
// call, which does not look at the evaluation's deadline. Policies' glob.match is therefore
// matched by Go's regexp (linear in the text), on the regular expression the glob's tokens
// translate to, and bounded in work like the regex builtins. The glob is still compiled by
// the glob package first, so that a malformed one fails as it does in OPA.

// replacement answers the implementation wb runs in place of OPA's for builtin name, if any.
func replacement(name string) topdown.BuiltinFunc {
	if name == "glob.match" {
		return globMatch
	}
	if f := regexOneReplacement(name); f != nil {
		return f
	}
	return regexAllReplacement(name)
}

// globMatch is glob.match(pattern, delimiters, match), with OPA's operands: null delimiters
// are none, an empty array is ".".
func globMatch(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error) error {
	return matchGlob(bctx, operands, iter, newRegexOne)
}

// matchGlob is globMatch, its search counted when take answers it (regexmatch.go). Its
// refusals stop the evaluation (halted): as errors, OPA recorded them and went on, the call
// undefined, so that a rule denying a command by glob was skipped for a command long enough
// to be refused.
func matchGlob(bctx topdown.BuiltinContext, operands []*ast.Term, iter func(*ast.Term) error, take oneSearch) error {
	pattern, err := builtins.StringOperand(operands[0].Value, 1)
	if err != nil {
		return err
	}
	var delimiters []rune
	switch operands[1].Value.(type) {
	case ast.Null:
	case *ast.Array:
		if delimiters, err = builtins.RuneSliceOperand(operands[1].Value, 2); err != nil {
			return err
		}
		if len(delimiters) == 0 {
			delimiters = []rune{'.'}
		}
	default:
		return builtins.NewOperandTypeErr(2, operands[1].Value, "array", "null")
	}
	match, err := builtins.StringOperand(operands[2].Value, 3)
	if err != nil {
		return err
	}
	// Bounded before compiling, by the glob package or regexp: a long glob takes long to
	// compile, and its expression is longer still (each * and ? names the delimiters).
	if len(pattern) > maxRegexPattern {
		return halted(fmt.Errorf("a glob of %d bytes is too long to compile in one call (at most %d): use a simpler pattern",
			len(pattern), maxRegexPattern))
	}
	if _, err := glob.Compile(string(pattern), delimiters...); err != nil {
		return err
	}
	expr, err := globRegexp(string(pattern), delimiters)
	if err != nil {
		return halted(err)
	}
	p := regexCacheOf(bctx.Context).program(expr)
	if p.err != nil {
		return halted(p.err)
	}
	if a := take(p, string(match), stopOf(bctx)); a != nil {
		matched, err := a.match()
		if err != nil {
			return halted(err)
		}
		return iter(ast.InternedTerm(matched))
	}
	re := p.compiled()
	if re == nil {
		// The glob package took the glob, and OPA's builtin would match it: a refusal, as
		// an error would leave the call undefined (alternatives nested 1,250 deep are too
		// deep for Go's parser).
		_, err := regexp.Compile(expr)
		return halted(fmt.Errorf("the glob's expression does not compile (%w): use a simpler pattern", err))
	}
	return iter(ast.InternedTerm(re.MatchString(string(match))))
}

// globRegexp translates a well-formed glob to an anchored regular expression: * is any run
// of non-delimiters, ** any run, ? one non-delimiter, classes and alternatives as written.
func globRegexp(pattern string, delimiters []rune) (string, error) {
	one := `(?s:.)`
	if len(delimiters) > 0 {
		one = "[^" + classRunes(delimiters) + "]"
	}
	var b strings.Builder
	b.WriteString(`^(?:`)
	lx := syntax.NewLexer(pattern)
	var inClass, not bool
	var set, lo, hi string
	for {
		if b.Len() > maxRegexPattern {
			return "", fmt.Errorf("the glob's expression is too long to compile in one call (at most %d bytes): use a simpler pattern or fewer delimiters",
				maxRegexPattern)
		}
		tok := lx.Next()
		switch tok.Type {
		case syntax.EOF:
			b.WriteString(`)$`)
			return b.String(), nil
		case syntax.Error:
			return "", errors.New(tok.Data)
		case syntax.Text:
			if inClass {
				set += tok.Data
			} else {
				b.WriteString(regexp.QuoteMeta(tok.Data))
			}
		case syntax.Any:
			b.WriteString(one + "*")
		case syntax.Super:
			b.WriteString(`(?s:.*)`)
		case syntax.Single:
			b.WriteString(one)
		case syntax.RangeOpen:
			inClass, not, set, lo, hi = true, false, "", "", ""
		case syntax.Not:
			not = true
		case syntax.RangeLo:
			lo = tok.Data
		case syntax.RangeHi:
			hi = tok.Data
		case syntax.RangeBetween:
		case syntax.RangeClose:
			b.WriteByte('[')
			if not {
				b.WriteByte('^')
			}
			if lo != "" || hi != "" {
				b.WriteString(classRunes([]rune(lo)) + "-" + classRunes([]rune(hi)))
			} else {
				b.WriteString(classRunes([]rune(set)))
			}
			b.WriteByte(']')
			inClass = false
		case syntax.TermsOpen:
			b.WriteString(`(?:`)
		case syntax.TermSeparator:
			b.WriteByte('|')
		case syntax.TermsClose:
			b.WriteByte(')')
		}
	}
}

// classRunes writes runes for a regexp character class, punctuation escaped.
func classRunes(rs []rune) string {
	var b strings.Builder
	for _, r := range rs {
		if r < unicode.MaxASCII && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			if unicode.IsPunct(r) || unicode.IsSymbol(r) {
				b.WriteByte('\\')
				b.WriteRune(r)
				continue
			}
			fmt.Fprintf(&b, `\x{%x}`, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
