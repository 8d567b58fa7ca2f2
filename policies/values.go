package policies

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/types"
)

// A value in Rego may share its parts: [a | some _ in numbers.range(1, 16)] holds one term
// sixteen times, so five such rules make 16^5 elements out of almost nothing. OPA walks
// values expanded: unification (x == y) recurses one Go stack frame per element it compares,
// and two such values compared past Go's stack limit end the whole process, a failure no
// recover can catch; comparison, hashing collisions and conversion to JSON take time and
// memory in the expanded size too, and none of them looks at the evaluation's deadline.
//
// So no value a policy makes at run time may be bigger, written out, than maxValueBytes (or the
// evaluation's EvalMemory if smaller): a compiler stage (checkValues) puts a check
// (wb.bounded.value) wherever an evaluation makes a new collection: after every comprehension
// and every array, object or set written with variables, on the value and key of every rule and
// function, after every builtin call that may answer a collection, and before a reference to
// a whole partial rule or package. A value is made from checked ones, so its check stops at the bound
// however much it shares; and unification recurses at most as deep as the smaller of the two
// values it compares. Its frames stay on the stack while the rest of the body runs, though,
// so a unification of two values already bound (a comparison, x == y) becomes a call of
// equal, which compares without holding the stack. The check charges the collection's own
// elements (not what it shares) to the memory budget: building it allocated them.

// maxValueBytes bounds one value's size written out, each element counting termBytes more
// (about 60,000 elements).
const maxValueBytes = 4 << 20

// valueCheck is the name of the check the compiler stage inserts.
const valueCheck = boundedPrefix + "value"

var valueCheckDecl = &ast.Builtin{
	Name: valueCheck,
	Decl: types.NewFunction(types.Args(types.A, types.B), types.B),
}

// valueCheckFunction implements valueCheck(value, made): true, or the evaluation halts. made:
// the value was just built (a comprehension or a collection written with variables), so its
// elements are charged; a builtin's answer was charged by the builtin.
func valueCheckFunction(budgetFor func(context.Context) *budget) func(*rego.Rego) {
	return rego.FunctionDyn(&rego.Function{Name: valueCheck, Decl: valueCheckDecl.Decl},
		func(bctx rego.BuiltinContext, terms []*ast.Term) (*ast.Term, error) {
			if len(terms) < 2 {
				return ast.BooleanTerm(true), nil
			}
			b := budgetFor(bctx.Context)
			limit := min(b.limit, maxValueBytes)
			stop := func() bool { return bctx.Cancel != nil && bctx.Cancel.Cancelled() }
			if n := textSize(terms[0].Value, limit, termBytes, stop); n > limit {
				if stop() {
					return nil, rego.NewHaltError(fmt.Errorf("policy evaluation timed out"))
				}
				return nil, rego.NewHaltError(fmt.Errorf("%w: a value would be more than %s written out (a "+
					"collection holding other collections counts them in full, however often they repeat): build smaller values",
					ErrEvalMemory, bytesText(limit)))
			}
			if terms[1].Value.Compare(ast.Boolean(true)) != 0 {
				return ast.BooleanTerm(true), nil
			}
			made := length(terms[0].Value) * termBytes
			if made > b.left.Load() {
				return nil, b.overrun("a collection", made)
			}
			b.left.Add(-made)
			return ast.BooleanTerm(true), nil
		})
}

// checkValues is the compiler stage that inserts the value checks (see above). It runs
// once the compiler has flattened bodies: comprehensions are assigned to variables, and
// calls and references are taken out of collections.
func checkValues(c *ast.Compiler) *ast.Error {
	var vars int
	for _, name := range slices.Sorted(maps.Keys(c.Modules)) {
		for _, r := range c.Modules[name].Rules {
			for ; r != nil; r = r.Else {
				safe := ast.NewVarSet(ast.DefaultRootDocument.Value.(ast.Var), ast.InputRootDocument.Value.(ast.Var))
				for _, a := range r.Head.Args {
					safe.Update(a.Vars())
				}
				r.Body = checkedBody(c, r.Body, safe, &vars)
				for _, t := range []*ast.Term{r.Head.Key, r.Head.Value} {
					if built(t) {
						e := checkOf(t, true)
						e.Generated, e.Location = true, r.Location
						r.Body.Append(e)
					}
				}
			}
		}
	}
	return nil
}

// check is one value to check: made, it was just built and its elements are charged.
type check struct {
	t    *ast.Term
	made bool
}

// checkedBody answers body with the checks of the values its expressions make, and those of
// the bodies of its comprehensions and every.
//
// safe are the variables bound before body runs. A unification of two values already bound
// becomes a comparison (equal): unification holds a stack frame per element it compared
// while the rest of the body runs, so a body of many comparisons of large values would still
// pile them up past the stack's limit; equal returns before the body goes on.
func checkedBody(c *ast.Compiler, body ast.Body, safe ast.VarSet, vars *int) ast.Body {
	safe = safe.Copy()
	checked := make(ast.Body, 0, len(body))
	for _, expr := range body {
		ast.WalkClosures(expr, func(x any) bool {
			switch x := x.(type) {
			case *ast.ArrayComprehension:
				x.Body = checkedBody(c, x.Body, safe, vars)
			case *ast.SetComprehension:
				x.Body = checkedBody(c, x.Body, safe, vars)
			case *ast.ObjectComprehension:
				x.Body = checkedBody(c, x.Body, safe, vars)
			case *ast.Every:
				x.Body = checkedBody(c, x.Body, safe, vars)
			case *ast.Not: // not { … }: a body of its own, checked as any other
				x.Body = checkedBody(c, x.Body, safe, vars)
			case *ast.LogicalAnd:
				x.Lhs, x.Rhs = checkedBody(c, x.Lhs, safe, vars), checkedBody(c, x.Rhs, safe, vars)
			case *ast.LogicalOr:
				x.Lhs, x.Rhs = checkedBody(c, x.Lhs, safe, vars), checkedBody(c, x.Rhs, safe, vars)
			default:
				return false
			}
			return true // checkedBody went inside
		})
		var operands []*ast.Term
		switch ts := expr.Terms.(type) {
		case []*ast.Term:
			operands = ts[1:]
		case *ast.Term:
			operands = []*ast.Term{ts}
		}
		outputs := ast.OutputVarsFromExpr(c, expr, safe)
		safeBefore := safe.Copy()
		var compares []*ast.Expr
		// Not under a negation: it would hoist a reference out of it (a "not input.a == x"
		// that held for an undefined input.a would fail), and a negation's frames are gone
		// before the body goes on.
		if expr.IsEquality() && !expr.Negated && len(operands) == 2 && comparesMade(operands[0], safe) && comparesMade(operands[1], safe) {
			terms := expr.Terms.([]*ast.Term)
			terms[0] = ast.NewTerm(ast.Equal.Ref())
			for i, t := range terms[1:] {
				if _, ok := t.Value.(ast.Ref); ok { // a builtin's operands are evaluated already
					v := freshVar(vars)
					checked = append(checked, generated(ast.Equality.Expr(v, t), expr))
					if wholeCollection(c, t) {
						checked = append(checked, generated(checkOf(v, false), expr))
					}
					terms[i+1], operands[i] = v, v
				}
			}
		}
		safe.Update(outputs)
		var before, after []check
		out := -1 // the operand a call answers in
		if expr.IsCall() {
			if n := c.GetArity(expr.Operator()); n >= 0 && n < len(operands) {
				out = n
			}
		}
		for i, t := range operands {
			switch {
			case i == out && (built(t) || callMakes(expr.Operator())):
				after = append(after, check{t, built(t)})
			case expr.IsEquality() && isComprehension(t):
				// The other side holds the comprehension's value once it is made.
				if other := operands[1-i]; isVar(other) {
					after = append(after, check{other, true})
				}
			case built(t) && expr.IsEquality():
				// Unification recurses only as deep as the smaller side: against a variable
				// (checked, or unbound) the collection is checked once it is made; against
				// anything else (another collection, a comprehension) before, and after too,
				// for the values its variables took. A pattern (with variables still unbound)
				// has its bound ones compared after it, with equal.
				if t.Vars().DiffCount(safeBefore) > 0 && !expr.Negated {
					var pairs [][2]*ast.Term
					t = unboundPattern(t, safeBefore, vars, &pairs)
					expr.Terms.([]*ast.Term)[i+1], operands[i] = t, t
					for _, p := range pairs {
						compares = append(compares, ast.Equal.Expr(p[0], p[1]))
					}
				} else if !isVar(operands[1-i]) {
					before = append(before, check{t, false})
				}
				after = append(after, check{t, true})
			case built(t):
				before = append(before, check{t, true}) // an argument, bound before the call
			case wholeCollection(c, t):
				before = append(before, check{t, false})
			}
		}
		for _, w := range expr.With { // a value the expression runs with, as input or data
			if built(w.Value) {
				before = append(before, check{w.Value, true})
			}
		}
		if expr.Negated { // nothing is bound after a negation
			before, after, compares = append(before, after...), nil, nil
		}
		// A check runs on bound values only (a builtin's operands must be).
		before = slices.DeleteFunc(before, func(ch check) bool { return ch.t.Vars().DiffCount(safeBefore) > 0 })
		for _, ch := range before {
			if _, ok := ch.t.Value.(ast.Ref); ok { // a builtin's operands are evaluated already
				v := freshVar(vars)
				checked = append(checked, generated(ast.Equality.Expr(v, ch.t.Copy()), expr))
				ch.t = v
			}
			checked = append(checked, generated(checkOf(ch.t, ch.made), expr))
		}
		checked = append(checked, expr)
		for _, e := range compares {
			checked = append(checked, generated(e, expr))
		}
		for _, ch := range after {
			checked = append(checked, generated(checkOf(ch.t, ch.made), expr))
		}
	}
	for i := range checked {
		checked[i].Index = i
	}
	return checked
}

// originalOf answers the declaration of a bounded builtin's original, or nil.
func originalOf(name string) *ast.Builtin {
	if orig, ok := strings.CutPrefix(name, boundedPrefix); ok {
		return ast.BuiltinMap[orig]
	}
	return nil
}

// callMakes: op is a builtin whose answer may be a collection (a function's value is checked
// where it is made: its head).
func callMakes(op ast.Ref) bool {
	b := ast.BuiltinMap[op.String()]
	if b == nil {
		b = originalOf(op.String())
	}
	if b == nil || b.Name == valueCheck {
		return false
	}
	r := b.Decl.Result()
	for _, scalar := range []types.Type{types.S, types.N, types.B, types.Nl} {
		if types.Compare(r, scalar) == 0 {
			return false
		}
	}
	return r != nil
}

func freshVar(vars *int) *ast.Term {
	*vars++
	return ast.VarTerm(fmt.Sprintf("__wbvalue%d__", *vars))
}

// generated answers e as made for expr: at its place, and with its with modifiers, so that
// e sees the input and data expr does.
func generated(e *ast.Expr, expr *ast.Expr) *ast.Expr {
	e.Generated, e.Location = true, expr.Location
	for _, w := range expr.With {
		e.With = append(e.With, w.Copy())
	}
	return e
}

func checkOf(t *ast.Term, made bool) *ast.Expr {
	return ast.NewExpr([]*ast.Term{ast.NewTerm(boundedRef("value")), t.Copy(), ast.BooleanTerm(made)})
}

// built: t is an array, object or set written with variables, made when the expression runs.
func built(t *ast.Term) bool {
	if t == nil {
		return false
	}
	switch t.Value.(type) {
	case *ast.Array, ast.Object, ast.Set:
		return !t.IsGround()
	}
	return false
}

// unboundPattern answers pattern t with each variable of safe in it (in array elements and
// object values) replaced by a fresh one, adding the (fresh, variable) pairs to compare.
func unboundPattern(t *ast.Term, safe ast.VarSet, vars *int, pairs *[][2]*ast.Term) *ast.Term {
	switch v := t.Value.(type) {
	case ast.Var:
		if safe.Contains(v) {
			f := freshVar(vars)
			*pairs = append(*pairs, [2]*ast.Term{f, t})
			return f
		}
	case *ast.Array:
		elems := make([]*ast.Term, v.Len())
		for i := range elems {
			elems[i] = unboundPattern(v.Elem(i), safe, vars, pairs)
		}
		return ast.ArrayTerm(elems...)
	case ast.Object:
		kvs := make([][2]*ast.Term, 0, v.Len())
		v.Foreach(func(k, val *ast.Term) {
			kvs = append(kvs, [2]*ast.Term{k, unboundPattern(val, safe, vars, pairs)})
		})
		return ast.ObjectTerm(kvs...)
	}
	return t
}

// comparesMade: t, one side of a unification, is bound already (it needs no variable not in
// safe and makes nothing, as a comprehension would) and is not a constant. A constant's side
// bounds the unification by its own size, and such unifications (input.tier == 4) stay as
// they are: rule indexing reads them.
func comparesMade(t *ast.Term, safe ast.VarSet) bool {
	return !isComprehension(t) && !ast.IsConstant(t.Value) && t.Vars().DiffCount(safe) == 0
}

func isVar(t *ast.Term) bool {
	_, ok := t.Value.(ast.Var)
	return ok
}

func isComprehension(t *ast.Term) bool {
	switch t.Value.(type) {
	case *ast.ArrayComprehension, *ast.SetComprehension, *ast.ObjectComprehension:
		return true
	}
	return false
}

// wholeCollection: t refers to the whole of a partial rule (a set or object made of many rule
// results, each checked but not together) or of a package. A reference to a complete rule's
// value, or into a partial rule, answers values already checked.
func wholeCollection(c *ast.Compiler, t *ast.Term) bool {
	ref, ok := t.Value.(ast.Ref)
	if !ok || !ref.HasPrefix(ast.DefaultRootRef) {
		return false
	}
	if !ref.IsGround() {
		prefix := ref.GroundPrefix()
		return len(c.GetRulesExact(prefix)) == 0 && len(c.GetRulesWithPrefix(prefix)) > 0
	}
	exact := c.GetRulesExact(ref)
	for _, r := range exact {
		if r.Head.RuleKind() != ast.SingleValue || !r.Head.Ref().IsGround() {
			return true
		}
	}
	return len(exact) == 0 && len(c.GetRulesWithPrefix(ref)) > 0
}
