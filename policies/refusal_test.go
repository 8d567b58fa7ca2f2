package policies

import (
	"context"
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/types"
)

// sampleOf writes a Rego literal of type tp.
func sampleOf(tp types.Type) string {
	switch x := tp.(type) {
	case types.String:
		return `"ab"`
	case types.Number:
		return "1"
	case types.Boolean:
		return "true"
	case types.Null:
		return "null"
	case *types.Array:
		if d := x.Dynamic(); d != nil {
			return "[" + sampleOf(d) + "]"
		}
		parts := make([]string, x.Len())
		for i := range parts {
			parts[i] = sampleOf(x.Select(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case *types.Set:
		return "{" + sampleOf(x.Of()) + "}"
	case *types.Object:
		var parts []string
		for _, p := range x.StaticProperties() {
			k, _ := json.Marshal(p.Key)
			parts = append(parts, string(k)+": "+sampleOf(p.Value))
		}
		if d := x.DynamicProperties(); d != nil && len(parts) == 0 {
			parts = append(parts, sampleOf(d.Key)+": "+sampleOf(d.Value))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case types.Any:
		if len(x) > 0 {
			return sampleOf(x[0])
		}
	}
	return `"ab"`
}

// refusingCalls are calls refused by each bounded builtin whose answer to sample operands
// costs nothing (a boolean, or nothing it makes) or that fails on them: its bound on work or
// its operands' length or digits.
func refusingCalls() map[string]string {
	long := `"` + strings.Repeat("a", 20<<10) + `"`
	huge := "1" + strings.Repeat("0", 1100)
	return map[string]string{
		"regex.match":                      `regex.match(` + long + `, "")`,
		"re_match":                         `re_match(` + long + `, "")`,
		"regex.template_match":             `regex.template_match(` + long + `, "", "{", "}")`,
		"regex.is_valid":                   `regex.is_valid(` + long + `)`,
		"regex.split":                      `regex.split(` + long + `, "")`,
		"regex.find_n":                     `regex.find_n(` + long + `, "", 1)`,
		"regex.find_all_string_submatch_n": `regex.find_all_string_submatch_n(` + long + `, "", 1)`,
		"regex.replace":                    `regex.replace("", ` + long + `, "")`,
		"glob.match":                       `glob.match(` + long + `, [], "")`,
		"graphql.is_valid":                 `graphql.is_valid(` + long + `, "type Query { a: Int }")`,
		"graphql.parse":                    `graphql.parse(` + long + `, "type Query { a: Int }")`,
		"graphql.parse_and_verify":         `graphql.parse_and_verify(` + long + `, "type Query { a: Int }")`,
		"semver.is_valid":                  `semver.is_valid(` + long + `)`,
		"semver.compare":                   `semver.compare(` + long + `, "1.0.0")`,
		"time.parse_duration_ns":           `time.parse_duration_ns(` + long + `)`,
		"time.parse_ns":                    `time.parse_ns(` + long + `, "")`,
		"time.parse_rfc3339_ns":            `time.parse_rfc3339_ns(` + long + `)`,
		"time.format":                      `time.format([1, ` + long + `])`,
		"time.date":                        `time.date([1, ` + long + `])`,
		"time.clock":                       `time.clock([1, ` + long + `])`,
		"time.weekday":                     `time.weekday([1, ` + long + `])`,
		"time.diff":                        `time.diff([1, ` + long + `], 1)`,
		"units.parse":                      `units.parse("1e9999")`,
		"units.parse_bytes":                `units.parse_bytes("1e9999")`,
		"to_number":                        `to_number(` + long + `)`,
		"object.subset":                    `object.subset([x | some x in numbers.range(1, 5000)], [x | some x in numbers.range(1, 5000)])`,
		"net.cidr_contains_matches":        `net.cidr_contains_matches([x | some _ in numbers.range(1, 200); x := "10.0.0.0/8"], [x | some _ in numbers.range(1, 200); x := "10.0.0.1"])`,
		"net.cidr_merge":                   `net.cidr_merge([sprintf("10.%d.%d.0/24", [x, y]) | some x in numbers.range(0, 127); some y in numbers.range(0, 255)])`,
		"net.cidr_expand":                  `net.cidr_expand("10.0.0.0/8")`,
		"product":                          `product([` + huge[:600] + `, ` + huge[:600] + `])`,
		"bits.lsh":                         `bits.lsh(1, 5000)`,
		"sprintf":                          `sprintf("%2000d", [1])`,
		"io.jwt.decode_verify":             `io.jwt.decode_verify("a.b.c", {"cert": ` + long + `})`,
		"crypto.x509.parse_certificates":   `crypto.x509.parse_certificates(` + long + `)`,
	}
}

// refusalNames matches a refusal message's mentions of a builtin by name: the name before a
// colon, as each layer prefixes its errors, or as what "would make" a value.
func refusalNames(name string) *regexp.Regexp {
	return regexp.MustCompile(`(?:^|[^\w.])` + regexp.QuoteMeta(name) + `(?::| would make)`)
}

// TestRefusalsNameTheBuiltinOnce: a bounded builtin's refusal named it twice ("regex.match:
// regex.match: a pattern of …", "numbers.range: policy evaluation exceeded its memory budget:
// numbers.range would make …"): OPA prefixes a builtin's error with its name, and so did wb.
// Each bounded builtin's refusal, evaluated with a budget already spent or operands past
// its bounds, names it once.
func TestRefusalsNameTheBuiltinOnce(t *testing.T) {
	ctx := context.Background()
	specific := refusingCalls()
	// Calls refused for what they make past a spent budget, whose sample operands fail.
	spentCalls := map[string]string{"base64.decode": `base64.decode("YWJj")`, "format_int": "format_int(1, 10)"}
	long := `"` + strings.Repeat("a", 30<<10) + `"`
	// The key builtins' operands bounded for their base64 runs (keywork.go).
	keyOperands := map[string][]int{
		"crypto.parse_private_keys": {0}, "crypto.x509.parse_certificate_request": {0}, "crypto.x509.parse_keypair": {0, 1},
		"crypto.x509.parse_rsa_private_key": {0}, "io.jwt.encode_sign": {2}, "io.jwt.encode_sign_raw": {2},
	}
	for _, alg := range []string{"rs256", "rs384", "rs512", "ps256", "ps384", "ps512", "es256", "es384", "es512", "eddsa"} {
		keyOperands["io.jwt.verify_"+alg] = []int{1}
	}
	var unrefused []string
	for _, name := range slices.Sorted(maps.Keys(boundedBuiltins)) {
		decl := ast.BuiltinMap[name]
		if decl == nil || decl.Deprecated || strings.HasPrefix(name, "internal.") {
			continue
		}
		spent := newBudget(defaultEvalMemory)
		spent.left.Store(0)
		call, budget := specific[name], newBudget(defaultEvalMemory)
		if c, ok := spentCalls[name]; ok {
			call, budget = c, spent
		}
		if call == "" {
			args := decl.Decl.FuncArgs().Args
			samples := make([]string, len(args))
			for i, a := range args {
				samples[i] = sampleOf(a)
			}
			// Keys and certificates too long, else what the call makes past a spent budget.
			if at, ok := keyOperands[name]; ok {
				for _, i := range at {
					if strings.HasPrefix(samples[i], "{") {
						samples[i] = `{"k": ` + long + `}`
					} else {
						samples[i] = long
					}
				}
			} else {
				budget = spent
				// Strings that differ, so that trim and its kin answer something.
				for i := 1; i < len(samples); i++ {
					if samples[i] == `"ab"` {
						samples[i] = `"x"`
					}
				}
			}
			call = name + "(" + strings.Join(samples, ", ") + ")"
		}
		src := "package wb.admission\n\ndeny contains \"x\" if {\n\t_ := " + call + "\n}\n"
		c, err := compile(ctx, capabilities(), "refusal.rego", src)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		_, err = c.pq.Eval(context.WithValue(ctx, budgetKey{}, budget))
		if err == nil {
			unrefused = append(unrefused, name)
			continue
		}
		msg := unbounded(err.Error())
		if n := len(refusalNames(name).FindAllStringIndex(msg, -1)); n != 1 {
			t.Errorf("%s's refusal names it %d times: %.300s", name, n, msg)
		}
	}
	if len(unrefused) > 0 {
		t.Errorf("not refused, give them a refusing call: %v", unrefused)
	}
}
