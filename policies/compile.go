package policies

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// pointOf answers the decision point of a package: a policy's package names its point.
func pointOf(pkg string) (string, bool) {
	switch pkg {
	case "wb.admission":
		return PointAdmission, true
	case "wb.runtime":
		return PointRuntime, true
	case "wb.spend":
		return PointSpend, true
	}
	return "", false
}

// Decision points, as in session.PointAdmission and friends.
const (
	PointAdmission = "admission"
	PointRuntime   = "runtime"
	PointSpend     = "spend"
)

// SourceError is one problem found compiling a policy, at a 1-based line and column (0 when
// the compiler gave no position).
type SourceError struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Row     int    `json:"row"`
	Col     int    `json:"col"`
}

// CompileError reports why a policy was rejected.
type CompileError struct {
	Errors []SourceError `json:"errors"`
}

func (e *CompileError) Error() string {
	var b strings.Builder
	b.WriteString("policy does not compile: ")
	for i, se := range e.Errors {
		if i > 0 {
			b.WriteString("; ")
		}
		if se.Row > 0 {
			fmt.Fprintf(&b, "line %d, column %d: ", se.Row, se.Col)
		}
		b.WriteString(se.Message)
	}
	return b.String()
}

// compileError converts OPA's errors (ast.Errors from the parser or the compiler, or one
// *ast.Error) into a *CompileError; other errors are wrapped as they are.
func compileError(err error) error {
	var errs ast.Errors
	if !errors.As(err, &errs) {
		var one *ast.Error
		if !errors.As(err, &one) {
			return &CompileError{Errors: []SourceError{{Message: unbounded(err.Error())}}}
		}
		errs = ast.Errors{one}
	}
	ce := &CompileError{}
	for _, e := range errs {
		ce.Errors = append(ce.Errors, sourceError(e))
	}
	return ce
}

func sourceError(e *ast.Error) SourceError {
	se := SourceError{Code: e.Code, Message: unbounded(e.Message)}
	if name, ok := strings.CutPrefix(se.Message, "undefined function "); ok {
		if why, ok := forbiddenBuiltins[name]; ok {
			se.Message += fmt.Sprintf(": %s is not available to policies (it %s)", name, why)
		}
	}
	if e.Code != "" {
		se.Message = e.Code + ": " + se.Message
	}
	if e.Location != nil {
		se.Row, se.Col = e.Location.Row, e.Location.Col
	}
	return se
}

func locError(loc *ast.Location, msg string) *CompileError {
	se := SourceError{Code: "wb_policy_error", Message: msg}
	if loc != nil {
		se.Row, se.Col = loc.Row, loc.Col
	}
	return &CompileError{Errors: []SourceError{se}}
}

// compiled is one module parsed, checked and prepared for evaluation.
type compiled struct {
	point  string
	masked []string
	pq     rego.PreparedEvalQuery
	// deterministic: the module calls no built-in whose answer may change between two calls
	// with the same arguments (time.now_ns, http.send, rand.intn, …), so that its document is
	// a function of the input alone.
	deterministic bool
}

// compile parses one Rego v1 module, checks that its package is a decision point's, reads
// its masked paths and prepares the query of its package. Problems in the source come back
// as *CompileError.
func compile(ctx context.Context, caps *ast.Capabilities, filename, source string) (*compiled, error) {
	mod, err := ast.ParseModuleWithOpts(filename, source, ast.ParserOptions{RegoVersion: ast.RegoV1, Capabilities: caps})
	if err != nil {
		return nil, compileError(err)
	}
	pkg := strings.TrimPrefix(mod.Package.Path.String(), "data.")
	point, ok := pointOf(pkg)
	if !ok {
		return nil, locError(mod.Package.Location, fmt.Sprintf(
			"package %s is not a decision point: use package wb.admission, wb.runtime or wb.spend", pkg))
	}
	masked, err := maskedPaths(mod)
	if err != nil {
		return nil, err
	}
	if err := checkStaticSize(mod); err != nil {
		return nil, err
	}
	c := newCompiler(caps)
	c.Compile(map[string]*ast.Module{filename: mod})
	if c.Failed() {
		return nil, compileError(c.Errors)
	}
	opts := append([]func(*rego.Rego){
		rego.Compiler(c),
		rego.Query(readQuery(pkg, point)),
		rego.SetRegoVersion(ast.RegoV1),
	}, boundedFunctions()...)
	pq, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, compileError(err)
	}
	return &compiled{point: point, masked: masked, pq: pq, deterministic: len(nondeterministicCalls(mod)) == 0}, nil
}

// readRules are the rules of each point's package that the platform reads (eval.go).
var readRules = map[string][]string{
	PointAdmission: {"deny", "warn", "defaults"},
	PointRuntime:   {"kill", "allow_egress"},
	PointSpend:     {"stop_sessions", "deny_admission", "warn"},
}

// readQuery asks for the rules of a point's package that the platform reads, and only them:
// OPA writes a query's answer out as Go values, expanded and outside the evaluation's budget
// and deadline, so the rest of the package (whatever its helper rules hold) is not evaluated
// nor converted, and each rule read is checked like any value the policy makes.
func readQuery(pkg, point string) string {
	names, _ := json.Marshal(readRules[point])
	return fmt.Sprintf("{k: v | some k in %s; v := data.%s[k]; %s(v, false)}", names, pkg, valueCheck)
}

// nondeterministicCalls names the built-ins mod calls whose answers may change between two
// calls with the same arguments.
func nondeterministicCalls(mod *ast.Module) []string {
	var names []string
	ast.WalkRefs(mod, func(r ast.Ref) bool {
		if b, ok := ast.BuiltinMap[r.String()]; ok && b.Nondeterministic && !slices.Contains(names, b.Name) {
			names = append(names, b.Name)
		}
		return false
	})
	return names
}

// maskedPaths reads `masked := ["request.metadata.secret", ...]`: dotted paths into the
// input whose values the decision log replaces with "***". It must be a constant array of
// strings.
func maskedPaths(mod *ast.Module) ([]string, error) {
	var out []string
	for _, r := range mod.Rules {
		ref := r.Head.Ref()
		if len(ref) == 0 || !ref[0].Equal(ast.VarTerm("masked")) {
			continue
		}
		bad := locError(r.Location, `masked must be a constant array of strings, e.g. masked := ["request.metadata.secret"]`)
		if len(ref) != 1 || r.Head.Value == nil || r.Head.Args != nil || !ast.IsConstant(r.Head.Value.Value) {
			return nil, bad
		}
		arr, ok := r.Head.Value.Value.(*ast.Array)
		if !ok {
			return nil, bad
		}
		for i := range arr.Len() {
			s, ok := arr.Elem(i).Value.(ast.String)
			if !ok || strings.TrimPrefix(string(s), "input.") == "" {
				return nil, bad
			}
			out = append(out, strings.TrimPrefix(string(s), "input."))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
