package policies

import (
	"context"
	"fmt"

	"github.com/open-policy-agent/opa/v1/rego"
)

// EvaluateLocal compiles one project policy as an upload would (the same Rego version,
// capabilities and size checks, so a module that fails here is refused by PUT /v1/policies)
// and evaluates it once on input, within ctx and the same memory budget as on the platform.
// It answers the decision point the module's package names and the rules of its package the
// platform reads (deny, warn, defaults, kill, …). For `wb policies test`: nothing else of the engine runs.
func EvaluateLocal(ctx context.Context, filename, source string, input any) (string, map[string]any, error) {
	c, err := compile(ctx, capabilities(), filename, source)
	if err != nil {
		return "", nil, err
	}
	rs, err := c.pq.Eval(withBudget(ctx, defaultEvalMemory), rego.EvalInput(input))
	if err != nil {
		return c.point, nil, fmt.Errorf("evaluate %s: %s", filename, unbounded(err.Error()))
	}
	doc := map[string]any{}
	if len(rs) > 0 && len(rs[0].Expressions) > 0 {
		if m, ok := rs[0].Expressions[0].Value.(map[string]any); ok {
			doc = m
		}
	}
	return c.point, doc, nil
}
