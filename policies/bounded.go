package policies

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// A tenant's Rego runs inside the control plane, so one evaluation must be bounded in memory
// as well as in time (Options.EvalTimeout). OPA's builtins are not: sprintf pads to any
// width, numbers.range allocates its whole array, concat and replace multiply strings, exact
// integer arithmetic grows without limit, and none of them looks at the evaluation's
// deadline while it works. So:
//
//   - builtins that reach the network or the host, or whose work inside one call has no
//     useful bound, are not available at all (forbiddenBuiltins): a policy using one does not
//     compile;
//   - builtins whose output can be large are replaced, at compile time, by bounded versions
//     (boundedBuiltins): the same function under the name wb.bounded.<name>, which estimates
//     what the call will make before making it, and charges what it made to the evaluation's
//     memory budget (Options.EvalMemory). A call that would go over stops the evaluation
//     with an error: the policy fails, and fails closed;
//   - numbers are kept to maxNumberDigits digits: literals at compile time, operands and
//     results of the arithmetic and parsing builtins at run time.
//
// OPA runs its own implementation of any builtin named in ast.BuiltinMap whatever a query
// registers under that name, so the bounded versions cannot keep the original names: a
// compiler stage (renameBounded) rewrites every call after refs are resolved, and the
// originals are removed from the capabilities, so a call the stage missed could not compile.

// boundedPrefix prefixes the bounded versions' names. Compile errors name the original.
const boundedPrefix = "wb.bounded."

const (
	// maxNumberDigits bounds the digits of any number a policy handles (exponents count).
	maxNumberDigits = 1000
	// termBytes is roughly what one element of an array, set or object costs.
	termBytes = 64
	// defaultEvalMemory is Options.EvalMemory's default.
	defaultEvalMemory = 32 << 20
)

// forbiddenBuiltins are not available to any policy, with why.
var forbiddenBuiltins = map[string]string{
	"http.send":               "reaches the network",
	"net.lookup_ip_addr":      "reaches the network (DNS)",
	"providers.aws.sign_req":  "signs requests with host credentials",
	"opa.runtime":             "reads the control plane's environment and configuration",
	"trace":                   "writes to the control plane's traces",
	"json.match_schema":       "loads $ref schemas from files and URLs",
	"json.verify_schema":      "loads $ref schemas from files and URLs",
	"strings.render_template": "runs a Go template whose output grows without bound inside one call",
	"graph.reachable_paths":   "answers a number of paths exponential in the graph",
	"regex.globs_match":       "takes time exponential in its patterns",
	"rego.parse_module":       "runs the Rego parser on run-time input, without a bound",
	"rand.intn":               "is random: a decision must follow from its input (and the decision log)",
	"uuid.rfc4122":            "is random: a decision must follow from its input (and the decision log)",
}

// sizeFunc estimates, before the call, the bytes a builtin will make from its operands. It
// may stop counting once past limit.
type sizeFunc func(ops []*ast.Term, limit int64, stop func() bool) (int64, error)

// boundedBuiltin is how one builtin is bounded: an estimate before the call (nil: operands'
// size bounds the output), whether its output is fresh all the way down (charged in full)
// rather than sharing its operands' terms (charged for its top level), and whether it takes
// a regex pattern.
type boundedBuiltin struct {
	estimate sizeFunc
	deep     bool
	// patterns: a regex builtin, whose implementation (regexall.go, regexmatch.go) checks its
	// pattern's size and work itself, with the evaluation's regexCache.
	patterns bool
}

// boundedBuiltins are the builtins replaced by bounded versions.
var boundedBuiltins = map[string]boundedBuiltin{
	// strings
	"sprintf":                  {estimate: estimateSprintf},
	"concat":                   {estimate: estimateConcat},
	"replace":                  {estimate: estimateReplace},
	"strings.replace_n":        {estimate: estimateReplaceN},
	"regex.replace":            {estimate: estimateRegexReplace, patterns: true},
	"internal.template_string": {estimate: textOf(1, false, 0)},
	"upper":                    {}, "lower": {}, "trim": {}, "trim_left": {}, "trim_right": {},
	"trim_prefix": {}, "trim_suffix": {}, "trim_space": {}, "strings.reverse": {}, "substring": {},
	"format_int": {},
	// splitting: one term per piece (find_all_string_submatch_n: an array of a term per group
	// for each match, charged whole, its strings, the text's, counted again)
	"split":                            {estimate: estimateSplit},
	"strings.split_n":                  {estimate: estimateSplit},
	"regex.split":                      {estimate: piecesOf(1, 1), patterns: true},
	"regex.find_n":                     {estimate: piecesOf(1, 1), patterns: true},
	"regex.find_all_string_submatch_n": {estimate: piecesOf(1, 4), deep: true, patterns: true},
	// matching: bounded in work, not size (regexwork.go; one search's work is counted as it
	// runs, regexmatch.go); regex.is_valid only parses, bounded like the patterns the others
	// take
	"regex.match":               {patterns: true},
	"re_match":                  {patterns: true},
	"regex.template_match":      {patterns: true},
	"regex.is_valid":            {estimate: estimateRegexIsValid},
	"glob.match":                {patterns: true}, // matched in linear time (globmatch.go)
	"indexof_n":                 {estimate: piecesOf(0, 1)},
	"net.cidr_expand":           {estimate: estimateCIDRExpand},
	"net.cidr_contains_matches": {estimate: estimateContainsMatches}, // and its set's work (cidrwork.go)
	"net.cidr_merge":            {estimate: estimateCIDRMerge},
	// encodings
	"json.marshal":              {estimate: textOf(1, false, 0)},
	"json.marshal_with_options": {estimate: estimateMarshalIndent},
	"yaml.marshal":              {estimate: textOf(2, false, 0)},
	"json.unmarshal":            {estimate: lengthOf(termBytes), deep: true},
	"yaml.unmarshal":            {estimate: lengthOf(termBytes), deep: true},
	"urlquery.decode_object":    {estimate: lengthOf(termBytes), deep: true},
	"graphql.parse":             {estimate: graphQLQuery(lengthOf(256)), deep: true},
	"graphql.parse_query":       {estimate: lengthOf(256), deep: true},
	"graphql.parse_schema":      {estimate: lengthOf(256), deep: true},
	"graphql.parse_and_verify":  {estimate: graphQLQuery(lengthOf(256)), deep: true},
	"graphql.is_valid":          {estimate: graphQLQuery(nil)},
	"base64.encode":             {estimate: lengthOf(2)},
	"base64url.encode":          {estimate: lengthOf(2)},
	"base64url.encode_no_pad":   {estimate: lengthOf(2)},
	"hex.encode":                {estimate: lengthOf(2)},
	"urlquery.encode":           {estimate: lengthOf(3)},
	"urlquery.encode_object":    {estimate: textOf(3, false, 0)},
	"base64.decode":             {}, "base64url.decode": {}, "hex.decode": {}, "urlquery.decode": {},
	// collections
	"numbers.range":      {estimate: estimateRange},
	"numbers.range_step": {estimate: estimateRange},
	"array.concat":       {estimate: elementsOf(0, 1)},
	"array.flatten":      {estimate: estimateFlatten},
	"array.slice":        {estimate: elementsOf(0)},
	"array.reverse":      {estimate: elementsOf(0)},
	"union":              {estimate: estimateUnion},
	"intersection":       {estimate: estimateUnion},
	"or":                 {estimate: elementsOf(0, 1)},
	"and":                {estimate: elementsOf(0)},
	"minus":              {estimate: elementsOf(0)},
	"object.union":       {estimate: elementsOf(0, 1)},
	"object.union_n":     {estimate: estimateUnion},
	"object.filter":      {estimate: elementsOf(0)},
	"object.remove":      {estimate: elementsOf(0)},
	"object.keys":        {estimate: elementsOf(0)},
	"json.filter":        {estimate: elementsOf(0)},
	"json.remove":        {estimate: elementsOf(0)},
	"json.patch":         {estimate: textOf(1, true, 1)},
	"sort":               {estimate: elementsOf(0)},
	"object.subset":      {estimate: estimateSubset},
	"graph.reachable":    {estimate: elementsOf(0)},
	// keys and certificates: bounded in work (keywork.go)
	"crypto.x509.parse_certificates":                         {estimate: keyMaterial(0)},
	"crypto.x509.parse_and_verify_certificates":              {estimate: keyMaterial(0)},
	"crypto.x509.parse_and_verify_certificates_with_options": {estimate: keyMaterial(0, 1)},
	"crypto.x509.parse_certificate_request":                  {estimate: keyMaterial(0)},
	"crypto.x509.parse_keypair":                              {estimate: keyMaterial(0, 1)},
	"crypto.x509.parse_rsa_private_key":                      {estimate: keyMaterial(0)},
	"crypto.parse_private_keys":                              {estimate: keyMaterial(0)},
	"io.jwt.verify_rs256":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_rs384":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_rs512":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_ps256":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_ps384":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_ps512":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_es256":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_es384":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_es512":                                    {estimate: keyMaterial(1)},
	"io.jwt.verify_eddsa":                                    {estimate: keyMaterial(1)},
	"io.jwt.decode_verify":                                   {estimate: keyMaterial(1)},
	"io.jwt.encode_sign":                                     {estimate: keyMaterial(2)},
	"io.jwt.encode_sign_raw":                                 {estimate: keyMaterial(2)},
	// numbers
	"plus": {}, "mul": {}, "div": {}, "rem": {}, "abs": {}, "round": {}, "ceil": {}, "floor": {},
	"sum": {}, "max": {}, "min": {},
	"product":  {estimate: estimateProductDigits},
	"bits.lsh": {estimate: estimateShift},
	"bits.rsh": {}, "bits.and": {}, "bits.or": {}, "bits.xor": {}, "bits.negate": {},
	"to_number":         {estimate: stringAtMost(0, maxNumberDigits+16)},
	"units.parse":       {estimate: estimateUnits},
	"units.parse_bytes": {estimate: estimateUnits},
	// time and versions: texts of at most maxTimeText bytes
	"time.parse_duration_ns": {estimate: stringsAtMost(maxTimeText, 0)},
	"time.parse_ns":          {estimate: stringsAtMost(maxTimeText, 0, 1)},
	"time.parse_rfc3339_ns":  {estimate: stringsAtMost(maxTimeText, 0)},
	"time.format":            {estimate: zonedTimes(0)},
	"time.date":              {estimate: zonedTimes(0)},
	"time.clock":             {estimate: zonedTimes(0)},
	"time.weekday":           {estimate: zonedTimes(0)},
	"time.add_date":          {estimate: zonedTimes(0)},
	"time.diff":              {estimate: zonedTimes(0, 1)},
	"semver.compare":         {estimate: stringsAtMost(maxTimeText, 0, 1)},
	"semver.is_valid":        {estimate: stringsAtMost(maxTimeText, 0)}, // parses as semver.compare does
}

// maxTimeText bounds the texts the time and semver builtins take (a date, a layout, a
// duration, a version: a few dozen bytes). A duration with days, weeks or years goes through
// OPA's PEG parser, about 3 µs and 50 bytes of allocation a byte (2 MB took 6 s and 100 MiB);
// the others' errors quote their operands, escaped (4 MB of control bytes made time.parse_ns
// allocate 518 MiB, time.parse_rfc3339_ns 263 MiB in 855 ms, semver.compare 145 MiB, and
// semver.is_valid 135 MiB for an error it answers false for), in one call that does not look
// at the deadline.
const maxTimeText = 1 << 10

// maxZoneName bounds a time zone name, which Go reads as a file name under each zoneinfo
// directory (a name of 4 MB allocated 32 MiB before the error).
const maxZoneName = 256

// stringsAtMost refuses an operand named (a string) longer than max bytes.
func stringsAtMost(max int, idx ...int) sizeFunc {
	return func(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
		for _, i := range idx {
			if i < len(ops) {
				if _, err := stringAtMost(i, max)(ops, limit, stop); err != nil {
					return 0, err
				}
			}
		}
		return 0, nil
	}
}

// zonedTimes refuses an operand named, a time [ns, zone, layout], whose zone is longer than
// maxZoneName or whose layout is longer than maxTimeText.
func zonedTimes(idx ...int) sizeFunc {
	return func(ops []*ast.Term, _ int64, _ func() bool) (int64, error) {
		for _, i := range idx {
			if i >= len(ops) {
				continue
			}
			a, ok := ops[i].Value.(*ast.Array)
			if !ok {
				continue // a number: no zone, no layout
			}
			if a.Len() > 1 && length(a.Elem(1).Value) > maxZoneName {
				return 0, fmt.Errorf("operand %d's time zone name is longer than %d bytes", i+1, maxZoneName)
			}
			if a.Len() > 2 && length(a.Elem(2).Value) > maxTimeText {
				return 0, fmt.Errorf("operand %d's layout is longer than %d bytes", i+1, maxTimeText)
			}
		}
		return 0, nil
	}
}

// capabilities are OPA's builtins minus the forbidden ones, with the bounded versions in
// place of the originals, and no network for the compiler.
func capabilities() *ast.Capabilities {
	c := ast.CapabilitiesForThisVersion()
	var bounded []*ast.Builtin
	c.Builtins = slices.DeleteFunc(c.Builtins, func(b *ast.Builtin) bool {
		if _, ok := forbiddenBuiltins[b.Name]; ok {
			return true
		}
		if _, ok := boundedBuiltins[b.Name]; ok {
			cp := *b
			cp.Name, cp.Infix = boundedPrefix+b.Name, ""
			bounded = append(bounded, &cp)
			// The compiler makes template strings only while it knows the builtin; its
			// calls are rewritten like the others.
			return b.Name != ast.InternalTemplateString.Name
		}
		return false
	})
	c.Builtins = append(c.Builtins, bounded...)
	c.Builtins = append(c.Builtins, valueCheckDecl)
	c.AllowNet = []string{}
	return c
}

// newCompiler answers a compiler for policies: the capabilities, and the stages that rewrite
// calls (and with targets and values) to their bounded versions and refuse oversized number
// literals.
func newCompiler(caps *ast.Capabilities) *ast.Compiler {
	return ast.NewCompiler().WithCapabilities(caps).
		WithStageAfterID(ast.StageRewriteRefsInHead,
			ast.CompilerStageDefinition{Name: "wb.bounded.with", MetricName: "compile_stage_wb_bounded_with", Stage: renameBoundedWith}).
		WithStageAfterID(ast.StageCheckRuleConflicts,
			ast.CompilerStageDefinition{Name: "wb.bounded", MetricName: "compile_stage_wb_bounded", Stage: renameBounded}).
		WithStageAfterID(ast.StageRewriteDynamicTerms,
			ast.CompilerStageDefinition{Name: "wb.values", MetricName: "compile_stage_wb_values", Stage: checkValues})
}

// renameBounded rewrites calls of bounded builtins to their bounded versions, and refuses
// number literals with more than maxNumberDigits digits. It runs once refs are resolved (a
// rule of the policy named like a builtin is data.…, not the builtin) and before undefined
// functions are checked.
func renameBounded(c *ast.Compiler) *ast.Error {
	var bad *ast.Error
	visit := func(t *ast.Term) bool {
		switch v := t.Value.(type) {
		case ast.Ref:
			if _, ok := boundedBuiltins[v.String()]; ok {
				t.Value = boundedRef(v.String())
			}
		case ast.Number:
			if bad == nil && !saneNumber(v) {
				bad = ast.NewError(ast.CompileErr, t.Location, "number %.20s… has more than %d digits", string(v), maxNumberDigits)
			}
		}
		return false
	}
	var rule func(r *ast.Rule)
	rule = func(r *ast.Rule) {
		ast.WalkTerms(r.Body, visit)
		for _, t := range []*ast.Term{r.Head.Key, r.Head.Value} {
			if t != nil {
				ast.WalkTerms(t, visit)
			}
		}
		for _, a := range r.Head.Args {
			ast.WalkTerms(a, visit)
		}
		if r.Else != nil {
			rule(r.Else)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Modules)) {
		for _, r := range c.Modules[name].Rules {
			rule(r)
		}
	}
	return bad
}

// renameBoundedWith rewrites the with keyword's targets and function values that name bounded
// builtins to their bounded versions, so that `with concat as mock` replaces the builtin the
// calls (renamed by renameBounded) reach, and `with concat as sprintf` puts bounded sprintf in
// its place. It runs before OPA checks the targets (StageRewriteWithValues), which knows the
// bounded names only, and after refs are resolved (a rule of the policy named like a builtin is
// data.…). It refuses forbidden builtins, as targets or values, by name (OPA's errors do not
// say which: "var http is unsafe"), and the value check (values.go) as a target: replaced,
// it let every rule the expression evaluates make values past maxValueBytes.
func renameBoundedWith(c *ast.Compiler) *ast.Error {
	var bad *ast.Error
	rename := func(t *ast.Term) {
		ref := refOf(t)
		if ref == nil || bad != nil {
			return
		}
		name := ref.String()
		if why, ok := forbiddenBuiltins[name]; ok {
			bad = ast.NewError(ast.CompileErr, t.Location, "with keyword: %s is not available to policies (it %s)", name, why)
			return
		}
		// internal.template_string stays: OPA refuses to replace internal functions.
		if _, ok := boundedBuiltins[name]; ok && !strings.HasPrefix(name, "internal.") {
			t.Value = boundedRef(name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Modules)) {
		ast.WalkWiths(c.Modules[name], func(w *ast.With) bool {
			if ref := refOf(w.Target); ref != nil && ref.String() == valueCheck && bad == nil {
				bad = ast.NewError(ast.CompileErr, w.Target.Location, "with keyword cannot replace the platform's value check")
			}
			rename(w.Target)
			rename(w.Value)
			// The value check follows the calls of builtins that may answer a collection, by
			// the name called, and a function's value where it is made (its head): a builtin
			// answering one in the place of another builtin, or of a function, went unchecked.
			if bad == nil && callMakes(refOf(w.Value)) && !callMakes(refOf(w.Target)) {
				bad = ast.NewError(ast.CompileErr, w.Value.Location, "with keyword: %v cannot replace %v: its answer may be a collection, where %v's is not",
					w.Value, w.Target, w.Target)
			}
			return false
		})
	}
	return bad
}

// refOf answers t as a ref (a variable as a ref of one term), or nil.
func refOf(t *ast.Term) ast.Ref {
	switch v := t.Value.(type) {
	case ast.Var:
		return ast.Ref{t}
	case ast.Ref:
		return v
	}
	return nil
}

// boundedRef is the ref of builtin name's bounded version.
func boundedRef(name string) ast.Ref {
	parts := strings.Split(boundedPrefix+name, ".")
	out := make(ast.Ref, len(parts))
	out[0] = ast.VarTerm(parts[0])
	for i, p := range parts[1:] {
		out[i+1] = ast.StringTerm(p)
	}
	return out
}

// unbounded names a bounded builtin the way the policy's author wrote it.
func unbounded(msg string) string { return strings.ReplaceAll(msg, boundedPrefix, "") }

// boundedFunctions answers the rego options that implement the bounded builtins, charging the
// budget the evaluation's context carries (withBudget).
func boundedFunctions() []func(*rego.Rego) { return boundedFunctionsCharging(budgetOf) }

// boundedFunctionsCharging is boundedFunctions charging the budget budgetFor answers for an
// evaluation's context.
func boundedFunctionsCharging(budgetFor func(context.Context) *budget) []func(*rego.Rego) {
	opts := make([]func(*rego.Rego), 0, len(boundedBuiltins)+1)
	opts = append(opts, valueCheckFunction(budgetFor))
	for _, name := range slices.Sorted(maps.Keys(boundedBuiltins)) {
		decl := ast.BuiltinMap[name]
		orig := topdown.GetBuiltin(name)
		if r := replacement(name); r != nil {
			orig = r
		}
		if decl == nil || orig == nil {
			continue // not in this OPA: nothing to bound
		}
		opts = append(opts, rego.FunctionDyn(&rego.Function{Name: boundedPrefix + name, Decl: decl.Decl,
			Nondeterministic: decl.Nondeterministic}, boundedImpl(name, decl.Decl.Arity(), orig, boundedBuiltins[name], budgetFor)))
	}
	return opts
}

// budget is the memory one policy evaluation may still make in builtins' outputs.
type budget struct {
	left  atomic.Int64
	limit int64
	// regex holds the evaluation's regex patterns, checked and compiled once.
	regex regexCache
}

type budgetKey struct{}

// withBudget answers ctx carrying a fresh budget of limit bytes for one evaluation.
func withBudget(ctx context.Context, limit int64) context.Context {
	return context.WithValue(ctx, budgetKey{}, newBudget(limit))
}

// newBudget answers a fresh budget of limit bytes (defaultEvalMemory when limit is not above 0).
func newBudget(limit int64) *budget {
	if limit <= 0 {
		limit = defaultEvalMemory
	}
	b := &budget{limit: limit}
	b.left.Store(limit)
	return b
}

func budgetOf(ctx context.Context) *budget {
	if b, ok := ctx.Value(budgetKey{}).(*budget); ok {
		return b
	}
	return newBudget(defaultEvalMemory) // an evaluation without one gets the default per call
}

// ErrEvalMemory is what a policy evaluation that would go over its memory budget fails with.
var ErrEvalMemory = errors.New("policy evaluation exceeded its memory budget")

// overrun is the halt of an evaluation whose what (the call, a collection) would make n
// bytes past the budget.
func (b *budget) overrun(what string, n int64) error {
	return rego.NewHaltError(b.overrunError(what, n))
}

// overrunError is overrun's error, not yet a halt.
func (b *budget) overrunError(what string, n int64) error {
	return fmt.Errorf("%w: %s would make %s, and the evaluation has %s left of %s: "+
		"work on smaller values", ErrEvalMemory, what, bytesText(n), bytesText(max(b.left.Load(), 0)), bytesText(b.limit))
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// boundedImpl is the bounded version of builtin name. Its errors do not name the builtin: OPA
// prefixes a function's error with its name (wb.bounded.<name>, written back as <name>).
func boundedImpl(name string, arity int, orig topdown.BuiltinFunc, bb boundedBuiltin, budgetFor func(context.Context) *budget) rego.BuiltinDyn {
	return func(bctx rego.BuiltinContext, terms []*ast.Term) (*ast.Term, error) {
		b := budgetFor(bctx.Context)
		ops := terms[:min(arity, len(terms))] // terms may end with the call's output
		for i, op := range ops {
			if n, ok := op.Value.(ast.Number); ok && !saneNumber(n) {
				return nil, rego.NewHaltError(fmt.Errorf("operand %d has more than %d digits", i+1, maxNumberDigits))
			}
		}
		left := b.left.Load()
		stop := func() bool { return bctx.Cancel != nil && bctx.Cancel.Cancelled() }
		if bb.patterns {
			bctx.Context = withRegexCache(bctx.Context, &b.regex)
		}
		if bb.estimate != nil {
			est, err := bb.estimate(ops, left, stop)
			if err != nil {
				return nil, rego.NewHaltError(err)
			}
			if stop() {
				return nil, rego.NewHaltError(errTimedOut)
			}
			if est > left {
				return nil, b.overrun("the call", est)
			}
		}
		var out *ast.Term
		err := orig(bctx, terms, func(t *ast.Term) error { out = t; return nil })
		if err != nil {
			var h topdown.Halt
			if errors.As(err, &h) {
				return nil, rego.NewHaltError(err)
			}
			return nil, err
		}
		if out == nil {
			return nil, nil
		}
		limit := left + 1
		var made int64
		if bb.deep {
			made = textSize(out.Value, limit, termBytes, stop)
		} else {
			made = shallowSize(out.Value)
		}
		if made > left {
			return nil, b.overrun("the call", made)
		}
		if !saneTerm(out.Value, bb.deep) {
			return nil, rego.NewHaltError(fmt.Errorf("the result has a number of more than %d digits", maxNumberDigits))
		}
		b.left.Add(-made)
		return out, nil
	}
}

// saneNumber: at most maxNumberDigits digits, counting a positive exponent.
func saneNumber(n ast.Number) bool {
	s := string(n)
	if len(s) > maxNumberDigits+8 {
		return false
	}
	i := strings.IndexAny(s, "eE")
	if i < 0 {
		return len(s) <= maxNumberDigits+2
	}
	exp := strings.TrimPrefix(s[i+1:], "+")
	if strings.HasPrefix(exp, "-") {
		exp = exp[1:]
		return len(exp) <= 4 // tiny numbers are not big, but 1e-99999999 still costs to expand
	}
	e := 0
	for _, c := range exp {
		if c < '0' || c > '9' || e > maxNumberDigits {
			return false
		}
		e = e*10 + int(c-'0')
	}
	return i+e <= maxNumberDigits
}

// saneTerm checks the numbers of a builtin's result: at its top level, or all the way down
// for fresh results.
func saneTerm(v ast.Value, deep bool) bool {
	ok := true
	check := func(t *ast.Term) bool {
		if n, isNum := t.Value.(ast.Number); isNum && !saneNumber(n) {
			ok = false
		}
		return !ok
	}
	switch x := v.(type) {
	case ast.Number:
		return saneNumber(x)
	case *ast.Array, ast.Set, ast.Object:
		if deep {
			ast.WalkTerms(x, check)
			return ok
		}
		each(x, func(t *ast.Term) { check(t) })
	}
	return ok
}

// each calls f on the top-level terms of a collection (keys and values of an object).
func each(v ast.Value, f func(*ast.Term)) {
	switch x := v.(type) {
	case *ast.Array:
		x.Foreach(f)
	case ast.Set:
		x.Foreach(f)
	case ast.Object:
		x.Foreach(func(k, v *ast.Term) { f(k); f(v) })
	}
}

func length(v ast.Value) int64 {
	switch x := v.(type) {
	case ast.String:
		return int64(len(x))
	case ast.Number:
		return int64(len(x))
	case *ast.Array:
		return int64(x.Len())
	case ast.Set:
		return int64(x.Len())
	case ast.Object:
		return int64(x.Len())
	}
	return 0
}

// shallowSize is what a result costs at its top level: the string, or one term per element
// plus the strings among them.
func shallowSize(v ast.Value) int64 {
	switch v.(type) {
	case ast.String, ast.Number:
		return length(v)
	case *ast.Array, ast.Set, ast.Object:
		n := length(v) * termBytes
		each(v, func(t *ast.Term) {
			if s, ok := t.Value.(ast.String); ok {
				n += int64(len(s))
			}
		})
		return n
	}
	return 0
}

// textSize estimates v's size written out as JSON, each element costing perTerm more; it
// stops counting past limit, so a small value shared many times over costs no more time than
// the limit.
func textSize(v ast.Value, limit, perTerm int64, stop func() bool) int64 {
	var n, nodes int64
	var walk func(v ast.Value)
	walk = func(v ast.Value) {
		if n > limit {
			return
		}
		if nodes++; nodes%4096 == 0 && stop() { // the evaluation's deadline passed
			n = limit + 1
			return
		}
		switch x := v.(type) {
		case ast.String:
			n += int64(len(x)) + 2
		case ast.Number:
			n += int64(len(x))
		case ast.Boolean, ast.Null:
			n += 5
		case *ast.Array, ast.Set, ast.Object:
			n += 2
			each(x, func(t *ast.Term) {
				n += 1 + perTerm
				walk(t.Value)
			})
		default:
			n += int64(len(v.String()))
		}
	}
	walk(v)
	return n
}

func str(ops []*ast.Term, i int) string {
	if i < len(ops) {
		if s, ok := ops[i].Value.(ast.String); ok {
			return string(s)
		}
	}
	return ""
}

// lengthOf: the output is at most factor bytes per byte of the first operand.
func lengthOf(factor int64) sizeFunc {
	return func(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
		return length(ops[0].Value)*factor + 16, nil
	}
}

// textOf: the output is at most factor times the text of the first operand (each element
// costing a term more when perTerm), plus the text of operand extra when it is not 0.
func textOf(factor int64, perTerm bool, extra int) sizeFunc {
	var per int64
	if perTerm {
		per = termBytes
	}
	return func(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
		n := factor * textSize(ops[0].Value, limit, per, stop)
		if extra > 0 && extra < len(ops) {
			n += textSize(ops[extra].Value, limit, termBytes, stop)
		}
		return n, nil
	}
}

// elementsOf: one term per element of the operands named.
func elementsOf(idx ...int) sizeFunc {
	return func(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
		var n int64
		for _, i := range idx {
			if i < len(ops) {
				n += length(ops[i].Value) * termBytes
			}
		}
		return n, nil
	}
}

// piecesOf: up to one piece per byte of operand s (a string), each piece costing the
// string's worth per piece of groups.
func piecesOf(s int, groups int64) sizeFunc {
	return func(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
		n := int64(len(str(ops, s))) + 1
		return n*groups*termBytes + n, nil
	}
}

func stringAtMost(i, max int) sizeFunc {
	return func(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
		if s, ok := ops[i].Value.(ast.String); ok && len(s) > max {
			return 0, fmt.Errorf("operand %d is longer than %d bytes", i+1, max)
		}
		return 0, nil
	}
}

// estimateUnits bounds units.parse's and units.parse_bytes's operand to 64 bytes, and the
// exponent of its number to maxNumberDigits: they compute the number exactly, and write it out
// in decimal, before its digits are checked ("1e999999" took half a second and a second, in one
// call that does not look at the deadline).
func estimateUnits(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
	if _, err := stringAtMost(0, 64)(ops, limit, stop); err != nil {
		return 0, err
	}
	s := strings.ReplaceAll(str(ops, 0), `"`, "") // as the builtins read it
	for i := 0; i < len(s); i++ {
		if s[i] != 'e' && s[i] != 'E' {
			continue
		}
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		k := j
		for k < len(s) && s[k] >= '0' && s[k] <= '9' {
			k++
		}
		if k == j {
			continue // a unit (E, Ei), not an exponent
		}
		if exp, err := strconv.Atoi(s[j:k]); err != nil || exp > maxNumberDigits {
			return 0, fmt.Errorf("the exponent %s is out of range (at most %d either way)", s[i+1:k], maxNumberDigits)
		}
	}
	return 0, nil
}

// maxSubsetWork bounds object.subset's work: it searches an array for a subarray by
// comparing every start with every element (arrays of 60,000 and 30,000 ones took 5 s in one
// call that does not look at the deadline), so the elements of its operands, multiplied,
// may be at most this.
const maxSubsetWork = 1 << 24

func estimateSubset(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	n, m := elements(ops[0].Value, maxSubsetWork, stop), elements(ops[1].Value, maxSubsetWork, stop)
	if n*m > maxSubsetWork {
		return 0, fmt.Errorf("comparing %d elements with %d is too much work for one call: compare smaller values", n, m)
	}
	return 0, nil
}

// elements counts the elements of v at every depth (keys and values of an object), a string
// once more for each 64 bytes (comparing two equal strings reads them to their ends), stopping
// past limit.
func elements(v ast.Value, limit int64, stop func() bool) int64 {
	var n int64
	var walk func(v ast.Value)
	walk = func(v ast.Value) {
		if n > limit {
			return
		}
		if n%4096 == 4095 && stop() {
			n = limit + 1
			return
		}
		each(v, func(t *ast.Term) {
			n++
			if s, ok := t.Value.(ast.String); ok {
				n += int64(len(s)) / 64
			}
			walk(t.Value)
		})
	}
	walk(v)
	return n
}

// maxGraphQLQuery bounds the query a graphql builtin validates against a schema: validation
// compares every pair of fields a selection set answers under one name, inside one call that
// does not look at the deadline (a 32 KiB query of one field repeated took 21 s).
const maxGraphQLQuery = 2 << 10

// graphQLQuery refuses a query (operand 0) over maxGraphQLQuery bytes, then answers est (nil:
// none).
func graphQLQuery(est sizeFunc) sizeFunc {
	at := stringAtMost(0, maxGraphQLQuery)
	return func(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
		if _, err := at(ops, limit, stop); err != nil {
			return 0, fmt.Errorf("the query is too long to validate: %w", err)
		}
		if est == nil {
			return 0, nil
		}
		return est(ops, limit, stop)
	}
}

// estimateSprintf bounds sprintf's output: the format, each verb's width and precision, and
// the text of the values (a value can be printed once per verb that names it). Widths and
// precisions above 1000, and * ones, are refused.
func estimateSprintf(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
	format := str(ops, 0)
	var widths, verbs int64
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		verbs++
	scan:
		for i++; i < len(format); i++ {
			c := format[i]
			switch {
			case c == '*':
				return 0, errors.New("* widths and precisions are not allowed")
			case c == '[':
				for i < len(format) && format[i] != ']' {
					i++
				}
			case c >= '0' && c <= '9':
				j := i
				for j < len(format) && format[j] >= '0' && format[j] <= '9' {
					j++
				}
				w := format[i:j]
				if len(w) > 4 || (len(w) == 4 && w > "1000") {
					return 0, fmt.Errorf("width or precision %s is above 1000", w)
				}
				var n int64
				for _, d := range w {
					n = n*10 + int64(d-'0')
				}
				widths += n
				i = j - 1
			case c == '+' || c == '-' || c == '#' || c == ' ' || c == '.':
			default:
				break scan
			}
		}
	}
	var values int64
	if len(ops) > 1 {
		var largest int64
		each(ops[1].Value, func(t *ast.Term) {
			n := textSize(t.Value, limit, 0, stop)
			values += n
			largest = max(largest, n)
		})
		// With explicit indexes one value can be printed by every verb.
		if strings.Contains(format, "[") {
			values = max(values, largest*verbs)
		}
	}
	return int64(len(format)) + widths + values, nil
}

func estimateConcat(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	delim := int64(len(str(ops, 0)))
	var n int64
	each(ops[1].Value, func(t *ast.Term) { n += length(t.Value) + delim })
	return n, nil
}

func estimateReplace(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	s, old, repl := str(ops, 0), str(ops, 1), str(ops, 2)
	var hits int
	if old == "" {
		hits = utf8.RuneCountInString(s) + 1
	} else {
		hits = strings.Count(s, old)
	}
	return int64(len(s)) + int64(hits)*int64(max(len(repl)-len(old), 0)), nil
}

func estimateReplaceN(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	var longest int64
	if o, ok := ops[0].Value.(ast.Object); ok {
		o.Foreach(func(_, v *ast.Term) { longest = max(longest, length(v.Value)) })
	}
	s := int64(len(str(ops, 1)))
	return s + (s+1)*longest, nil
}

// estimateRegexReplace: every match (at most one per byte, and one more) gets the
// replacement, each $ in which can bring back a match (together at most the whole input).
func estimateRegexReplace(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	s, value := int64(len(str(ops, 0))), str(ops, 2)
	return s + (s+1)*int64(len(value)) + int64(strings.Count(value, "$"))*s, nil
}

func estimateSplit(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	s, delim := str(ops, 0), str(ops, 1)
	var pieces int
	if delim == "" {
		pieces = utf8.RuneCountInString(s)
	} else {
		pieces = strings.Count(s, delim) + 1
	}
	return int64(pieces)*termBytes + int64(len(s)), nil
}

// estimateCIDRExpand: one term per address. It parses the CIDR with net, as the builtin does:
// net/netip refuses some CIDRs that net takes (a prefix length with a leading zero), which
// would pass unestimated.
func estimateCIDRExpand(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	_, p, err := net.ParseCIDR(str(ops, 0))
	if err != nil {
		return 0, nil // the builtin reports it
	}
	ones, bits := p.Mask.Size()
	host := bits - ones
	if host > 20 {
		return 0, fmt.Errorf("%s has 2^%d addresses; at most 2^20 can be expanded", str(ops, 0), host)
	}
	return int64(1<<host) * (termBytes + 40), nil
}

func estimateProduct(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	a, b := max(length(ops[0].Value), 1), max(length(ops[1].Value), 1)
	if a > 1<<24 || b > 1<<24 {
		return 1 << 62, nil
	}
	return a * b * 3 * termBytes, nil
}

// estimateMarshalIndent: with indent and prefix every line carries them, once per level.
func estimateMarshalIndent(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
	n := textSize(ops[0].Value, limit, 0, stop)
	if len(ops) < 2 {
		return n, nil
	}
	var extra int64
	if o, ok := ops[1].Value.(ast.Object); ok {
		for _, k := range []string{"indent", "prefix"} {
			if v := o.Get(ast.StringTerm(k)); v != nil {
				extra += length(v.Value)
			}
		}
	}
	depth := int64(depthOf(ops[0].Value, 0))
	return n + n*extra*(depth+1), nil
}

func depthOf(v ast.Value, d int) int {
	if d > 64 {
		return d
	}
	deepest := d
	each(v, func(t *ast.Term) { deepest = max(deepest, depthOf(t.Value, d+1)) })
	return deepest
}

// estimateRange: one term per number in the range.
func estimateRange(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	var ends [3]int64
	for i := range min(len(ops), 3) {
		n, ok := ops[i].Value.(ast.Number)
		if !ok {
			return 0, nil // the builtin reports it
		}
		v, ok := n.Int64()
		if !ok {
			f, fok := n.Float64()
			if !fok || f > 1<<62 || f < -(1<<62) {
				return 1 << 62, nil
			}
			v = int64(f)
		}
		ends[i] = v
	}
	count := ends[1] - ends[0]
	if count < 0 {
		count = -count
	}
	if len(ops) == 3 && ends[2] > 0 {
		count /= ends[2]
	}
	if count > 1<<40 {
		return 1 << 62, nil
	}
	return (count + 1) * termBytes, nil
}

// estimateFlatten counts the leaves array.flatten will copy, stopping past the limit.
func estimateFlatten(ops []*ast.Term, limit int64, stop func() bool) (int64, error) {
	var n int64
	var walk func(v ast.Value)
	walk = func(v ast.Value) {
		a, ok := v.(*ast.Array)
		if !ok {
			n += termBytes
			return
		}
		if stop() {
			n = limit + 1
			return
		}
		for i := 0; i < a.Len() && n <= limit; i++ {
			walk(a.Elem(i).Value)
		}
	}
	walk(ops[0].Value)
	return n, nil
}

func estimateUnion(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	var n int64
	each(ops[0].Value, func(t *ast.Term) { n += length(t.Value) * termBytes })
	return n, nil
}

func estimateProductDigits(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	var digits int64
	each(ops[0].Value, func(t *ast.Term) { digits += length(t.Value) })
	if digits > maxNumberDigits {
		return 0, fmt.Errorf("the product would have more than %d digits", maxNumberDigits)
	}
	return digits, nil
}

func estimateShift(ops []*ast.Term, _ int64, stop func() bool) (int64, error) {
	if n, ok := ops[1].Value.(ast.Number); ok {
		if v, ok := n.Int64(); !ok || v > 4*maxNumberDigits {
			return 0, fmt.Errorf("a shift of more than %d bits makes a number of more than %d digits", 4*maxNumberDigits, maxNumberDigits)
		}
	}
	return 0, nil
}

// maxStaticTerms bounds the terms of a value a policy writes down, once the rules and local
// variables it names are put in. OPA's type checker gives such a value a type as big as that
// (a rule of 16 references to a rule of 16 references to … has 16^depth), and walks it without
// sharing: eight such rules take it minutes. checkStaticSize refuses them before compiling.
const maxStaticTerms = 100_000

// checkStaticSize refuses a module whose rule values or local variables, expanded, have more
// than maxStaticTerms terms.
func checkStaticSize(mod *ast.Module) error {
	rules := map[string][]*ast.Rule{}
	for _, r := range mod.Rules {
		if ref := r.Head.Ref(); len(ref) > 0 {
			if v, ok := ref[0].Value.(ast.Var); ok {
				rules[string(v)] = append(rules[string(v)], r)
			}
		}
	}
	memo := map[string]int64{}
	var ruleSize func(name string) int64
	var termSize func(t *ast.Term, locals map[ast.Var]int64) int64
	var bodySize func(b ast.Body, locals map[ast.Var]int64) int64
	capAdd := func(a, b int64) int64 { return min(a+b, maxStaticTerms+1) }
	termSize = func(t *ast.Term, locals map[ast.Var]int64) int64 {
		if t == nil {
			return 0
		}
		switch v := t.Value.(type) {
		case ast.Var:
			if n, ok := locals[v]; ok {
				return n
			}
			return ruleSize(string(v))
		case ast.Ref:
			head := ast.Var("")
			if h, ok := v[0].Value.(ast.Var); ok {
				head = h
			}
			if n, ok := locals[head]; ok {
				return n
			}
			if len(v) > 3 && head.Equal(ast.DefaultRootDocument.Value) { // data.wb.<point>.<rule>
				if s, ok := v[3].Value.(ast.String); ok {
					return ruleSize(string(s))
				}
			}
			return ruleSize(string(head))
		case *ast.ArrayComprehension:
			inner := maps.Clone(locals)
			return capAdd(bodySize(v.Body, inner), termSize(v.Term, inner))
		case *ast.SetComprehension:
			inner := maps.Clone(locals)
			return capAdd(bodySize(v.Body, inner), termSize(v.Term, inner))
		case *ast.ObjectComprehension:
			inner := maps.Clone(locals)
			return capAdd(bodySize(v.Body, inner), capAdd(termSize(v.Key, inner), termSize(v.Value, inner)))
		case ast.Call:
			return 1 // typed by the function's result, whatever its arguments
		}
		n := int64(1)
		stop := false
		ast.WalkTerms(t.Value, func(c *ast.Term) bool {
			if stop || c == t {
				return stop
			}
			n = capAdd(n, termSize(c, locals))
			stop = n > maxStaticTerms
			return true // termSize went inside c already
		})
		return n
	}
	bodySize = func(b ast.Body, locals map[ast.Var]int64) int64 {
		var most int64
		for _, e := range b {
			if e.IsAssignment() || e.IsEquality() {
				if v, ok := e.Operand(0).Value.(ast.Var); ok {
					locals[v] = termSize(e.Operand(1), locals)
					most = max(most, locals[v])
					continue
				}
			}
			switch ts := e.Terms.(type) {
			case []*ast.Term:
				for _, t := range ts[1:] {
					most = max(most, termSize(t, locals))
				}
			case *ast.Term:
				most = max(most, termSize(ts, locals))
			case *ast.Not:
				most = max(most, bodySize(ts.Body, maps.Clone(locals)))
			case *ast.LogicalAnd:
				most = max(most, bodySize(ts.Lhs, maps.Clone(locals)), bodySize(ts.Rhs, maps.Clone(locals)))
			case *ast.LogicalOr:
				most = max(most, bodySize(ts.Lhs, maps.Clone(locals)), bodySize(ts.Rhs, maps.Clone(locals)))
			}
		}
		return most
	}
	ruleSize = func(name string) int64 {
		if n, ok := memo[name]; ok {
			return n
		}
		memo[name] = 1 // a cycle is an error the compiler reports
		var most int64 = 1
		for _, r := range rules[name] {
			for ; r != nil; r = r.Else {
				locals := map[ast.Var]int64{}
				most = max(most, bodySize(r.Body, locals))
				most = max(most, termSize(r.Head.Value, locals), termSize(r.Head.Key, locals))
			}
		}
		memo[name] = most
		return most
	}
	for _, name := range slices.Sorted(maps.Keys(rules)) {
		if ruleSize(name) > maxStaticTerms {
			r := rules[name][0]
			return locError(r.Location, fmt.Sprintf("rule %s builds a value of more than %d terms out of the rules and "+
				"variables it names; build it with a comprehension, or from smaller values", name, maxStaticTerms))
		}
	}
	return nil
}
