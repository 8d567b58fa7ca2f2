package policies

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

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

// maxRegexInsts bounds the compiled program of one call's pattern, whatever its text: a
// repeat copies its body into the program (a 3 KiB body repeated a thousand times compiled to
// 3 million instructions, for seconds and a gigabyte of allocation, on an empty text), and the
// pattern is compiled by the check, then by the builtin (which keeps it in OPA's cache).
const maxRegexInsts = 1 << 16

// maxRegexPattern bounds a pattern's length, and maxRegexRunes the runes of its character
// classes: Go's parser, which the check runs before anything, expands each class to its
// ranges (\pL to 1,300 runes), so that 192 KiB of \pL took half a second and 200 MiB to parse.
const (
	maxRegexPattern = 16 << 10
	maxRegexRunes   = 1 << 17
)

// unicodeClassRunes answers the runes the Unicode class escapes of pattern (\pL, \p{Greek},
// \P{^N}) expand to, each counted in full, read from the pattern's text: so that a pattern of
// many is refused before Go's parser expands them (16 KiB of \pL took 175 ms to parse before
// maxRegexRunes refused the parse). It counts what the parser appends, which it merges
// afterwards (neighbouring ranges, the classes of one bracket): at least what the parse holds.
func unicodeClassRunes(pattern string) int64 {
	var n int64
	known := map[string]int64{}
	for i := 0; i+1 < len(pattern); i++ {
		if pattern[i] != '\\' {
			continue
		}
		i++
		switch pattern[i] {
		case 'Q': // literal text up to \E
			end := strings.Index(pattern[i:], `\E`)
			if end < 0 {
				return n
			}
			i += end + 1
		case 'p', 'P':
			if i+1 >= len(pattern) {
				return n
			}
			name := pattern[i+1 : i+2]
			if name == "{" {
				end := strings.IndexByte(pattern[i+1:], '}')
				if end < 0 {
					return n
				}
				name = strings.TrimPrefix(pattern[i+2:i+1+end], "^")
				i += end + 1
			} else {
				i++
			}
			runes, ok := known[name]
			if !ok {
				runes = unicodeRunes(name)
				known[name] = runes
			}
			n += runes
		}
	}
	return n
}

func unicodeClassesError(runes int64) error {
	return fmt.Errorf("a pattern whose Unicode classes (\\p) expand to about %d runes is too large to compile in one call "+
		"(at most %d): use fewer Unicode classes", runes, maxRegexRunes)
}

// checkRegexClasses refuses a pattern whose classes Go's parser would take too long to
// expand, from its text, before the parser runs.
func checkRegexClasses(pattern string) error {
	if runes := unicodeClassRunes(pattern); runes > maxRegexRunes {
		return unicodeClassesError(runes)
	}
	if runes := foldedClassRunes(pattern); runes > maxRegexFoldRunes {
		return foldedClassesError(runes)
	}
	return nil
}

func foldedClassesError(runes int64) error {
	return fmt.Errorf("a case-insensitive pattern whose class ranges hold %d runes with a case is too large to compile "+
		"in one call (at most %d, as each is folded alone): use narrower ranges, or (?i) on less of the pattern", runes, maxRegexFoldRunes)
}

// maxRegexFoldRunes bounds the runes of a case-insensitive pattern's class ranges that Go's
// parser folds one at a time (appendFoldedRange looks up each rune of a range that is not
// all of 'A' to maxFold, 20 to 30 ns each) before it merges them: 1,364 ranges
// [B-\x{1E942}] under (?i) took 4 s to parse, and merged to classes under maxRegexRunes.
const maxRegexFoldRunes = 1 << 18

// The runes Go's parser folds (regexp/syntax's minFold and maxFold).
const (
	minFoldRune = 0x41
	maxFoldRune = 0x1e943
)

// foldedClassRunes answers the runes Go's parser folds one at a time in pattern's class ranges
// if any part of it is case-insensitive, read from its text as the parser reads its classes,
// up to the first thing the parser would refuse (it stops there).
func foldedClassRunes(pattern string) int64 {
	if !caseInsensitive(pattern) {
		return 0
	}
	var n int64
	for t := pattern; t != ""; {
		switch {
		case strings.HasPrefix(t, `\Q`): // literal text up to \E
			end := strings.Index(t[2:], `\E`)
			if end < 0 {
				return n
			}
			t = t[2+end+2:]
		case t[0] == '\\':
			t = skipEscape(t)
		case t[0] == '[':
			runes, rest, ok := classFoldedRunes(t[1:])
			if n += runes; !ok {
				return n
			}
			t = rest
		default:
			t = t[1:]
		}
	}
	return n
}

// caseInsensitive reports whether pattern sets the flag i anywhere ("(?i)", "(?si:"), or
// might: text that only looks like a flag counts too.
func caseInsensitive(pattern string) bool {
	for t := pattern; ; {
		i := strings.Index(t, "(?")
		if i < 0 {
			return false
		}
		t = t[i+2:]
		flags := t[:len(t)-len(strings.TrimLeft(t, "imsU-"))]
		if rest := t[len(flags):]; strings.ContainsRune(flags, 'i') && rest != "" && (rest[0] == ')' || rest[0] == ':') {
			return true
		}
	}
}

// skipEscape answers t after the escape it starts with: a backslash and a byte, the braces
// of \x{...}, \p{...} or \P{...}, or the rune naming a class in \pL.
func skipEscape(t string) string {
	if len(t) >= 3 && strings.IndexByte("xpP", t[1]) >= 0 && t[2] == '{' {
		if end := strings.IndexByte(t, '}'); end >= 0 {
			return t[end+1:]
		}
		return ""
	}
	if len(t) >= 3 && (t[1] == 'p' || t[1] == 'P') {
		_, size := utf8.DecodeRuneInString(t[2:])
		return t[2+size:]
	}
	return t[min(2, len(t)):]
}

// classFoldedRunes reads a class after its '[' as Go's parser does (parseClass), and answers
// the runes of its ranges folded one at a time, the text after its ']', and false when the
// parser would refuse it.
func classFoldedRunes(t string) (int64, string, bool) {
	var n int64
	t = strings.TrimPrefix(t, "^")
	for first := true; t != "" && (t[0] != ']' || first); first = false {
		if strings.HasPrefix(t, "[:") {
			if end := strings.Index(t[2:], ":]"); end >= 0 {
				t = t[2+end+2:]
				continue
			}
		}
		if len(t) >= 2 && t[0] == '\\' && strings.IndexByte("pPdDsSwW", t[1]) >= 0 {
			t = skipEscape(t)
			continue
		}
		lo, rest, ok := classRune(t)
		if !ok {
			return n, "", false
		}
		hi := lo
		if t = rest; len(t) >= 2 && t[0] == '-' && t[1] != ']' {
			if hi, t, ok = classRune(t[1:]); !ok || hi < lo {
				return n, "", false
			}
		}
		if (lo > minFoldRune || hi < maxFoldRune) && hi >= minFoldRune && lo <= maxFoldRune {
			n += int64(min(hi, maxFoldRune) - max(lo, minFoldRune) + 1)
		}
	}
	if t == "" {
		return n, "", false // missing ]
	}
	return n, t[1:], true
}

// classRune reads one rune of a class as Go's parser does (parseClassChar): a rune, or an
// escape (octal, hexadecimal, C or punctuation).
func classRune(t string) (rune, string, bool) {
	if t[0] != '\\' {
		r, size := utf8.DecodeRuneInString(t)
		return r, t[size:], r != utf8.RuneError || size > 1
	}
	if len(t) < 2 {
		return 0, "", false
	}
	c, t := t[1], t[2:]
	octal := func(c byte) bool { return '0' <= c && c <= '7' }
	switch {
	case c >= '1' && c <= '7' && (t == "" || !octal(t[0])):
		return 0, "", false // a backreference
	case octal(c):
		r := rune(c - '0')
		for i := 1; i < 3 && t != "" && octal(t[0]); i++ {
			r, t = r*8+rune(t[0]-'0'), t[1:]
		}
		return r, t, true
	case c == 'x' && strings.HasPrefix(t, "{"):
		end := strings.IndexByte(t, '}')
		if end < 2 {
			return 0, "", false
		}
		v, err := strconv.ParseUint(t[1:end], 16, 32)
		if err != nil || v > unicode.MaxRune || strings.ContainsAny(t[1:end], "+-_") {
			return 0, "", false
		}
		return rune(v), t[end+1:], true
	case c == 'x':
		v, err := strconv.ParseUint(t[:min(2, len(t))], 16, 8)
		if err != nil || len(t) < 2 || strings.ContainsAny(t[:2], "+-_") {
			return 0, "", false
		}
		return rune(v), t[2:], true
	}
	if r, ok := map[byte]rune{'a': '\a', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t', 'v': '\v'}[c]; ok {
		return r, t, true
	}
	if c < utf8.RuneSelf && !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
		return rune(c), t, true
	}
	return 0, "", false
}

// unicodeRunes answers the runes Go's parser makes of the Unicode class named (a category, a
// script, or an alias of a category, their names read as the parser reads them): two for each
// of its ranges, a range with a stride counting once for each rune in it, as the parser
// appends them before merging neighbours (0 for no such class).
func unicodeRunes(name string) int64 {
	name = canonicalClassName(name)
	switch name {
	case "Any", "Ascii":
		return 2
	case "Assigned":
		name = "Cn" // inverted
	case "Lc":
		name = "LC"
	}
	t := unicode.Categories[name]
	if t == nil {
		t = unicode.Scripts[name]
	}
	if t == nil {
		for alias, actual := range unicode.CategoryAliases {
			if canonicalClassName(alias) == name {
				t = unicode.Categories[actual]
			}
		}
	}
	if t == nil {
		return 0
	}
	var n int64
	for _, r := range t.R16 {
		n += strided(uint32(r.Lo), uint32(r.Hi), uint32(r.Stride))
	}
	for _, r := range t.R32 {
		n += strided(r.Lo, r.Hi, r.Stride)
	}
	return n
}

// canonicalClassName is a Unicode class's name as Go's parser looks it up (canonicalName):
// without underscores, hyphens and spaces, its first letter upper case and the others lower
// case (\p{l} and \p{letter} are \pL).
func canonicalClassName(name string) string {
	b := make([]byte, 0, len(name))
	for i := range len(name) {
		switch c := name[i]; {
		case c == '_' || c == '-' || c == ' ':
		case len(b) == 0 && 'a' <= c && c <= 'z':
			b = append(b, c-'a'+'A')
		case len(b) > 0 && 'A' <= c && c <= 'Z':
			b = append(b, c-'A'+'a')
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// strided answers the runes the parser appends for one range of a Unicode table: its ends,
// or with a stride each of its runes as a range of one.
func strided(lo, hi, stride uint32) int64 {
	if stride <= 1 {
		return 2
	}
	return 2 * int64(1+(hi-lo)/stride)
}

// maxRegexGroupWork bounds a pattern's instructions times its groups (plus one) for a call
// that answers the groups' positions: each step of the matcher may copy that many.
const maxRegexGroupWork = 1 << 20

// maxRegexWork bounds one regex builtin call's steps (pattern instructions times bytes of
// text, times the searches for the builtins that answer every match): about a tenth of a
// second to a second of one CPU.
const maxRegexWork = 1 << 26

// maxOPACachedInsts is the largest pattern, in instructions, left to OPA's own builtin when
// its call is within its bound. OPA keeps the last 100 patterns it compiled for the whole
// process, every tenant's: 100 regex.match calls of distinct 60,000-instruction patterns on
// "b" held 295 MiB after a GC. A larger pattern is searched here, with the pattern compiled
// for the evaluation (regexCache), and let go with it.
const maxOPACachedInsts = 4096

// maxMatchCount bounds the work of counting an all-match builtin's matches before it runs
// (checkRegexWork), which a call refused after all has spent for nothing: a quarter of
// maxRegexWork (about 2 s under the race detector, where maxRegexWork's whole took 8 s).
const maxMatchCount = maxRegexWork / 4

// dollarIn: regex.replace needs the groups' positions when operand i names one ($1), as
// regexp's ReplaceAllString asks for them (regexAll's searches).
func dollarIn(i int) func([]*ast.Term) bool {
	return func(ops []*ast.Term) bool { return strings.Contains(str(ops, i), "$") }
}

// estimateRegexIsValid bounds regex.is_valid, which compiles its pattern, as the pattern of
// the builtins that use one: its length, and its Unicode classes' runes.
func estimateRegexIsValid(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
	if _, err := stringAtMost(0, maxRegexPattern)(ops, limit, stop); err != nil {
		return 0, err
	}
	return 0, checkRegexClasses(str(ops, 0))
}

// checkRegexExpand checks regex.replace's expansion of value at every match of a pattern of
// groups groups (plus one) on text: regexp's Expand looks a reference by name ($name,
// ${name}, or a number it does not take, as $01) up among the pattern's groups one by one, so
// that a value of 200,000 references to a name no group has, with 100 groups matching empty
// over 40 bytes, took a second in one call. Each match (at most one per byte of the text, and
// one more) counts the named references times the groups plus one, within maxRegexWork.
func checkRegexExpand(value, text string, groups int64) error {
	if named := namedRefs(value); named > 0 {
		matches := int64(len(text)) + 1
		if named*groups > maxRegexWork/matches {
			return fmt.Errorf("a replacement of %d references by name, each looked up among the pattern's %d groups "+
				"and the match at each of up to %d matches, is too much work for one call (at most %d, multiplied): "+
				"use numbered references ($1) or fewer groups", named, groups-1, matches, maxRegexWork)
		}
	}
	return nil
}

// namedRefs counts the references of a regex.replace value that regexp's Expand looks up by
// name (it takes $1 to $999999999 without leading zeros, and ${1}, by number; a name
// missing its closing brace, which Expand leaves as it is, is counted too).
func namedRefs(value string) int64 {
	var n int64
	for {
		_, after, ok := strings.Cut(value, "$")
		if !ok {
			return n
		}
		if strings.HasPrefix(after, "$") {
			value = after[1:]
			continue
		}
		value = after
		rest := strings.TrimPrefix(after, "{")
		name := rest[:len(rest)-len(strings.TrimLeftFunc(rest, func(r rune) bool {
			return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_'
		}))]
		numbered := name != "" && len(name) <= 9 && strings.Trim(name, "0123456789") == "" && (name[0] != '0' || len(name) == 1)
		if name != "" && !numbered {
			n++
		}
	}
}

// regexProgram is a pattern as the regex builtins check and run it, made once per pattern in
// an evaluation (regexCache): parsed, its program's size counted and refused when too large
// (before compiling it: compiling is the work to avoid), and compiled for regexp only when a
// search runs here (else OPA's builtin compiles it, in its own cache).
type regexProgram struct {
	pattern string
	err     error // refused: too long, or too large to compile
	insts   int64 // the compiled program's instructions (0: the pattern does not compile)
	runes   int64 // the runes of its classes and literals (progSize)
	caps    int64 // its groups plus one
	free    bool  // no empty-width assertion (contextFree)

	once sync.Once
	re   *regexp.Regexp // nil: does not compile
}

// newRegexProgram checks pattern (checkRegexPattern).
func newRegexProgram(pattern string) *regexProgram {
	p := &regexProgram{pattern: pattern}
	p.insts, p.caps, p.runes, p.free, p.err = checkRegexPattern(pattern)
	return p
}

// compiled answers the pattern compiled by regexp (nil when it does not compile), compiling
// it on first use.
func (p *regexProgram) compiled() *regexp.Regexp {
	p.once.Do(func() {
		if p.err == nil && p.insts > 0 {
			p.re, _ = regexp.Compile(p.pattern)
		}
	})
	return p.re
}

// regexCache holds one evaluation's patterns (its budget's), so that a policy calling a regex
// builtin for each of many values parses and compiles the pattern once, not at each call (a
// pattern of 60,000 instructions took 25 ms). It keeps at most maxCachedPatterns, of
// maxCachedInsts instructions and maxCachedRunes runes in their classes and literals together
// (their compiled programs stay alive as long as the evaluation, charged to nothing; a class
// is one instruction holding its ranges, so that 64 patterns of 87 \pL each held 28 MiB):
// past them, a pattern is made again for each call.
type regexCache struct {
	mu       sync.Mutex
	programs map[string]*regexProgram
	insts    int64
	runes    int64
}

const (
	maxCachedPatterns = 64
	maxCachedInsts    = maxRegexInsts
	maxCachedRunes    = maxRegexRunes
)

// program answers pattern's regexProgram, from the cache when there (a nil cache: made for
// this call).
func (c *regexCache) program(pattern string) *regexProgram {
	if c == nil {
		return newRegexProgram(pattern)
	}
	c.mu.Lock()
	p, ok := c.programs[pattern]
	c.mu.Unlock()
	if ok {
		return p
	}
	p = newRegexProgram(pattern)
	c.mu.Lock()
	defer c.mu.Unlock()
	if q, ok := c.programs[pattern]; ok {
		return q
	}
	if len(c.programs) < maxCachedPatterns && c.insts+p.insts <= maxCachedInsts && c.runes+p.runes <= maxCachedRunes {
		if c.programs == nil {
			c.programs = make(map[string]*regexProgram)
		}
		c.programs[pattern] = p
		c.insts += p.insts
		c.runes += p.runes
	}
	return p
}

type regexCacheKey struct{}

// withRegexCache answers ctx carrying c, for the regex builtins' implementations.
func withRegexCache(ctx context.Context, c *regexCache) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithValue(ctx, regexCacheKey{}, c)
}

// regexCacheOf answers the cache ctx carries (nil: none).
func regexCacheOf(ctx context.Context) *regexCache {
	if ctx == nil {
		return nil
	}
	c, _ := ctx.Value(regexCacheKey{}).(*regexCache)
	return c
}

// checkRegex refuses a pattern too long or too large to compile, or too much work on text
// (regexProgram.check).
func checkRegex(pattern, text string, all, groups bool) error {
	return newRegexProgram(pattern).check(text, all, groups)
}

// check refuses p when too long or too large to compile, or too much work on text; all: the
// builtin searches again after each match; groups: the call asks for the positions of the
// pattern's groups, which the matcher copies for every thread at every step (4,000 groups on
// 60 bytes took 2.5 s and 514 MiB, on an empty text 1 s), so that each instruction counts
// once for each group, and once for the match. The all-match builtins always track them:
// OPA's run regexp's FindAll, which asks for every group (regex.replace too: with a
// cancellation, as every evaluation has, it runs FindAllSubmatchIndex), so that 3,000
// optional groups on 60 bytes took seconds in regex.find_n.
func (p *regexProgram) check(text string, all, groups bool) error {
	if p.err != nil {
		return p.err
	}
	insts, caps := p.insts, p.caps
	if groups {
		// One step copies (and first allocates) every thread's positions: bounded alone, as
		// the text's length does not bound it.
		if insts*caps > maxRegexGroupWork {
			return fmt.Errorf("a pattern of %d instructions and %d groups is too large for a call that tracks its groups' positions (at most %d, multiplied): use fewer groups",
				insts, caps-1, maxRegexGroupWork)
		}
		insts *= caps
	}
	if all && p.free {
		return nil // the builtin counts its searches' work as they run (regexall.go)
	}
	if err := checkRegexWork(p, insts, text, all); err != nil {
		if groups {
			return fmt.Errorf("%w (its instructions counted once for each of its %d groups and once for the match, as this builtin tracks their positions)", err, caps-1)
		}
		return err
	}
	return nil
}

// checkRegexPattern refuses a pattern too long or too large to compile, else answers
// regexInsts's.
func checkRegexPattern(pattern string) (insts, groups, runes int64, free bool, _ error) {
	if len(pattern) > maxRegexPattern {
		return 0, 1, 0, false, fmt.Errorf("a pattern of %d bytes is too long to compile in one call (at most %d): use a simpler pattern",
			len(pattern), maxRegexPattern)
	}
	if err := checkRegexClasses(pattern); err != nil {
		return 0, 1, 0, false, err
	}
	return regexInsts(pattern)
}

// checkRegexWork refuses insts instructions of p on text when their work could pass
// maxRegexWork. One search costs at most the instructions times the text's bytes. A builtin
// that answers every match (all) makes a search per match: with a long text it is refused
// unless counting its matches first, within maxMatchCount, finds few enough that its own
// searches stay within that too (a PATH of 20 KiB split on its colons, or 512 KiB searched
// for a flag, is taken; ".*b|a" over a text of a's is not). A search is counted as reading
// the whole text, as ".*b" does: a pattern that matches often on a long text is refused
// although its searches are short (unless it has no assertion: then the builtin runs its
// searches counting what they read, regexall.go).
func checkRegexWork(p *regexProgram, insts int64, text string, all bool) error {
	if regexWorkFits(p, insts, text, all) {
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

// regexWorkFits reports whether the work of insts instructions of p on text stays
// within maxRegexWork whatever its matches, or, for a builtin that answers every match (all),
// because they are few (checkRegexWork).
func regexWorkFits(p *regexProgram, insts int64, text string, all bool) bool {
	n := int64(len(text)) + 1
	search := insts * n
	return search <= maxRegexWork && (!all || search*n <= maxRegexWork || fewMatches(p, text, maxMatchCount/max(search, 1)))
}

// fewMatches reports whether p matches text few enough times, as the all-match
// builtins find matches (regexp's FindAll), for their searches to be at most searches. For
// m matches FindAll makes at most 2m+1 searches (one for each match, one for each empty match
// right after a match, which it skips, and the last, which finds none), and at most 2k-1 when
// asked for k at most: so counting up to k = (searches+1)/2 costs at most searches searches,
// and with fewer than k found, so does the builtin.
func fewMatches(p *regexProgram, text string, searches int64) bool {
	k := (searches + 1) / 2
	if k < 1 {
		return false
	}
	re := p.compiled()
	if re == nil {
		return true // the builtin reports it
	}
	return int64(len(re.FindAllStringIndex(text, int(min(k, 1<<30))))) < k
}

// regexInsts answers the size of pattern's compiled program, as regexp compiles it, its
// groups plus one, the runes of its classes and literals (progSize), and whether it has no
// empty-width assertion (contextFree) (0, 1, 0 and false for a pattern that does not
// compile: the builtin reports it), or refuses a pattern whose parse tree is too large to
// compile (not compiled: compiling is the work to avoid).
func regexInsts(pattern string) (insts, groups, runes int64, free bool, _ error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0, 1, 0, false, nil
	}
	n, runes := progSize(re)
	if n > maxRegexInsts || runes > maxRegexRunes {
		return 0, 1, 0, false, fmt.Errorf("a pattern of about %d instructions and %d runes in its classes is too large to compile in one call "+
			"(at most %d and %d): use a simpler pattern", n, runes, maxRegexInsts, maxRegexRunes)
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0, 1, 0, false, nil
	}
	return int64(len(prog.Inst)), int64(prog.NumCap / 2), runes, contextFree(re), nil
}

// progSize estimates the instructions the parse tree re compiles to, as regexp/syntax's parser
// does when it checks a pattern's size (a repeat counts its body once for each copy), and the
// runes of its literals and classes (once: copies share them).
func progSize(re *syntax.Regexp) (n, runes int64) {
	runes = int64(len(re.Rune))
	switch re.Op {
	case syntax.OpLiteral:
		n = int64(len(re.Rune))
	case syntax.OpCapture, syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		sub, r := progSize(re.Sub[0])
		n, runes = 2+sub, runes+r
	case syntax.OpConcat, syntax.OpAlternate:
		for _, s := range re.Sub {
			sub, r := progSize(s)
			n, runes = n+sub, runes+r
		}
		n += int64(len(re.Sub))
	case syntax.OpRepeat:
		sub, r := progSize(re.Sub[0])
		runes += r
		if re.Max == -1 {
			n = 2 + int64(max(re.Min, 1))*sub
		} else {
			n = int64(re.Max)*sub + int64(re.Max-re.Min)
		}
	}
	return max(1, n), runes
}

// templatePattern is the regular expression regex.template_match makes of tpl (OPA's
// generateRegexTemplate): ok is false when the delimiters do not balance.
func templatePattern(tpl string, start, end byte) (string, bool) {
	var b strings.Builder
	b.WriteByte('^')
	last := 0
	if !eachTemplatePart(tpl, start, end, func(lo, hi int) bool {
		fmt.Fprintf(&b, "%s(%s)", regexp.QuoteMeta(tpl[last:lo]), tpl[lo+1:hi])
		last = hi + 1
		return true
	}) {
		return "", false
	}
	b.WriteString(regexp.QuoteMeta(tpl[last:]))
	b.WriteByte('$')
	return b.String(), true
}
