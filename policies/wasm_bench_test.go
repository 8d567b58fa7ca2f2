package policies

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"wb/internal/wasmtest"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	opacompile "github.com/open-policy-agent/opa/v1/compile"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/util"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"wb/session"
)

// The Wasm experiment of issue 17: the shipped wb.admission compiled by OPA to Wasm and run
// under wazero through OPA's one-shot opa_eval (Wasm ABI 1.2), against the Go evaluator on
// the same input in the same run. Only the ABI this policy needs is implemented: memory and
// opa_abort/opa_println/opa_builtin0..4 imported from "env", opa_eval, and builtins that
// OPA's Wasm runtime lacks (sprintf here) called back into topdown's Go implementations.
//
// The shipped policy is compiled as written, not with the bounded builtins (wb.bounded.*
// are Go functions of this package, which a Wasm module cannot call without a host builtin
// of its own); a tenant's policy would need them as host builtins too.

// wasmAdmission is one instance of the policy module. It is not safe for concurrent use: a
// server would keep a pool of them.
type wasmAdmission struct {
	rt                  wazero.Runtime
	mem                 api.Memory
	opaEval             api.Function
	malloc              api.Function
	valueDump           api.Function
	valueParse          api.Function
	jsonDump            api.Function
	dataAddr, inputAddr uint32
	entrypoint          int32
	builtins            map[int32]topdown.BuiltinFunc
	stack               [7]uint64
	// parser: ast.ParseTerm would look up OPA's capabilities (sorting every builtin) on
	// each call.
	parser ast.ParserOptions
}

// wasmOfShippedAdmission compiles the shipped admission.rego to a Wasm module whose one
// entrypoint is the package document.
func wasmOfShippedAdmission(ctx context.Context) ([]byte, error) {
	src, err := shippedFS.ReadFile("admission.rego")
	if err != nil {
		return nil, err
	}
	mod, err := ast.ParseModuleWithOpts("admission.rego", string(src), ast.ParserOptions{RegoVersion: ast.RegoV1})
	if err != nil {
		return nil, err
	}
	b := &bundle.Bundle{Modules: []bundle.ModuleFile{{URL: "admission.rego", Path: "admission.rego", Raw: src, Parsed: mod}}}
	c := opacompile.New().WithTarget(opacompile.TargetWasm).WithEntrypoints("wb/admission").
		WithRegoVersion(ast.RegoV1).WithBundle(b).WithOutput(&bytes.Buffer{})
	if err := c.Build(ctx); err != nil {
		return nil, fmt.Errorf("opa build -t wasm: %w", err)
	}
	out := c.Bundle()
	if len(out.WasmModules) != 1 {
		return nil, fmt.Errorf("opa build -t wasm: %d modules, want 1", len(out.WasmModules))
	}
	return out.WasmModules[0].Raw, nil
}

// hostFuncs are the functions policy.wasm may import from "env", with their parameter
// counts (all i32; the builtins answer an i32).
var hostFuncs = []struct {
	name   string
	params int
	result bool
}{
	{"opa_abort", 1, false}, {"opa_println", 1, false},
	{"opa_builtin0", 2, true}, {"opa_builtin1", 3, true}, {"opa_builtin2", 4, true},
	{"opa_builtin3", 5, true}, {"opa_builtin4", 6, true},
}

// envGlue answers the bytes of a Wasm module that defines the memory the policy imports
// and re-exports the host functions of module "wbhost" under their names: the policy
// imports memory and functions from one module, "env", and a wazero host module cannot
// export a memory.
func envGlue(minPages, maxPages uint32) []byte {
	var types, imports, exports [][]byte
	for i, f := range hostFuncs {
		result := []byte{0}
		if f.result {
			result = []byte{1, 0x7f}
		}
		types = append(types, wasmtest.Cat([]byte{0x60}, wasmtest.ULEB(uint64(f.params)), bytes.Repeat([]byte{0x7f}, f.params), result))
		imports = append(imports, wasmtest.Cat(wasmtest.Str("wbhost"), wasmtest.Str(f.name), []byte{0x00}, wasmtest.ULEB(uint64(i))))
		exports = append(exports, wasmtest.Cat(wasmtest.Str(f.name), []byte{0x00}, wasmtest.ULEB(uint64(i))))
	}
	exports = append(exports, wasmtest.Cat(wasmtest.Str("memory"), []byte{0x02, 0}))
	memory := wasmtest.Cat([]byte{1, 0x01}, wasmtest.ULEB(uint64(minPages)), wasmtest.ULEB(uint64(maxPages)))
	return wasmtest.Cat([]byte("\x00asm\x01\x00\x00\x00"),
		wasmtest.Section(1, wasmtest.Vec(types...)),
		wasmtest.Section(2, wasmtest.Vec(imports...)),
		wasmtest.Section(5, memory),
		wasmtest.Section(7, wasmtest.Vec(exports...)))
}

func newWasmAdmission(ctx context.Context, policy []byte) (*wasmAdmission, error) {
	// Not WithCloseOnContextDone: its checks at every call and loop made the shipped
	// policy's evaluation about ten times slower (measured, p50 ~100 µs against ~10 µs). The
	// shipped policy has no loop an input can grow beyond its metadata; a tenant's policy
	// would need another bound (a deadline on a pool's instance, closed from outside).
	w := &wasmAdmission{rt: wazero.NewRuntime(ctx),
		parser: ast.ParserOptions{Capabilities: ast.CapabilitiesForThisVersion(), RegoVersion: ast.RegoV1}}
	ok := false
	defer func() {
		if !ok {
			_ = w.rt.Close(ctx)
		}
	}()
	cm, err := w.rt.CompileModule(ctx, policy)
	if err != nil {
		return nil, fmt.Errorf("compile policy.wasm: %w", err)
	}
	mems := cm.ImportedMemories()
	if len(mems) != 1 {
		return nil, fmt.Errorf("policy.wasm imports %d memories, want 1", len(mems))
	}
	maxPages, hasMax := mems[0].Max()
	if !hasMax {
		maxPages = 65536
	}

	host := w.rt.NewHostModuleBuilder("wbhost")
	for _, f := range hostFuncs {
		params := make([]api.ValueType, f.params)
		for i := range params {
			params[i] = api.ValueTypeI32
		}
		var results []api.ValueType
		if f.result {
			results = []api.ValueType{api.ValueTypeI32}
		}
		var fn api.GoModuleFunc
		switch f.name {
		case "opa_abort":
			fn = func(_ context.Context, _ api.Module, s []uint64) {
				panic(fmt.Errorf("opa_abort: %s", w.cstring(uint32(s[0]))))
			}
		case "opa_println":
			fn = func(context.Context, api.Module, []uint64) {}
		default:
			fn = w.builtin
		}
		host.NewFunctionBuilder().WithGoModuleFunction(fn, params, results).Export(f.name)
	}
	if _, err := host.Instantiate(ctx); err != nil {
		return nil, fmt.Errorf("host module: %w", err)
	}
	if _, err := w.rt.InstantiateWithConfig(ctx, envGlue(mems[0].Min(), maxPages), wazero.NewModuleConfig().WithName("env")); err != nil {
		return nil, fmt.Errorf("env module: %w", err)
	}
	mod, err := w.rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithName("policy"))
	if err != nil {
		return nil, fmt.Errorf("instantiate policy.wasm: %w", err)
	}
	w.mem = mod.Memory()
	w.opaEval, w.malloc = mod.ExportedFunction("opa_eval"), mod.ExportedFunction("opa_malloc")
	w.valueDump, w.valueParse = mod.ExportedFunction("opa_value_dump"), mod.ExportedFunction("opa_value_parse")
	w.jsonDump = mod.ExportedFunction("opa_json_dump")
	if w.opaEval == nil || w.mem == nil {
		return nil, errors.New("policy.wasm has no opa_eval or memory: ABI older than 1.2")
	}

	// Empty data; the heap past it is where each evaluation's input goes.
	if w.dataAddr, err = w.parse(ctx, mod.ExportedFunction("opa_json_parse"), []byte("{}")); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	res, err := mod.ExportedFunction("opa_heap_ptr_get").Call(ctx)
	if err != nil {
		return nil, err
	}
	w.inputAddr = uint32(res[0])

	var entrypoints, builtins map[string]int32
	for name, dst := range map[string]*map[string]int32{"entrypoints": &entrypoints, "builtins": &builtins} {
		res, err := mod.ExportedFunction(name).Call(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		res, err = w.jsonDump.Call(ctx, res[0])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := json.Unmarshal(w.cstring(uint32(res[0])), dst); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	id, found := entrypoints["wb/admission"]
	if !found {
		return nil, fmt.Errorf("policy.wasm has no entrypoint wb/admission: %v", entrypoints)
	}
	w.entrypoint = id
	w.builtins = map[int32]topdown.BuiltinFunc{}
	for name, id := range builtins {
		f := topdown.GetBuiltin(name)
		if f == nil {
			return nil, fmt.Errorf("policy.wasm needs builtin %s, which topdown lacks", name)
		}
		w.builtins[id] = f
	}
	ok = true
	return w, nil
}

func (w *wasmAdmission) Close(ctx context.Context) error { return w.rt.Close(ctx) }

// cstring reads the NUL-terminated bytes at addr (nil if out of memory).
func (w *wasmAdmission) cstring(addr uint32) []byte {
	b, ok := w.mem.Read(addr, w.mem.Size()-addr)
	if !ok {
		return nil
	}
	if n := bytes.IndexByte(b, 0); n >= 0 {
		return b[:n]
	}
	return nil
}

// parse copies raw into the module's heap and parses it with fn (opa_json_parse or
// opa_value_parse), answering the value's address.
func (w *wasmAdmission) parse(ctx context.Context, fn api.Function, raw []byte) (uint32, error) {
	res, err := w.malloc.Call(ctx, uint64(len(raw)))
	if err != nil {
		return 0, err
	}
	if !w.mem.Write(uint32(res[0]), raw) {
		return 0, fmt.Errorf("write %d bytes at %d", len(raw), res[0])
	}
	res, err = fn.Call(ctx, res[0], uint64(len(raw)))
	if err != nil {
		return 0, err
	}
	if res[0] == 0 {
		return 0, fmt.Errorf("policy.wasm could not parse %.40q", raw)
	}
	return uint32(res[0]), nil
}

// builtin is opa_builtinN(id, ctx, args...): a builtin the module lacks, run by topdown on
// the arguments as OPA values, its answer parsed back into the module's heap.
func (w *wasmAdmission) builtin(ctx context.Context, _ api.Module, s []uint64) {
	f := w.builtins[int32(s[0])]
	if f == nil {
		panic(fmt.Errorf("opa_builtin: unknown builtin %d", s[0]))
	}
	args := make([]*ast.Term, 0, len(s)-2)
	for _, a := range s[2:] {
		res, err := w.valueDump.Call(ctx, a)
		if err != nil {
			panic(err)
		}
		args = append(args, w.term(w.cstring(uint32(res[0]))))
	}
	var out *ast.Term
	if err := f(topdown.BuiltinContext{Context: ctx}, args, func(t *ast.Term) error { out = t; return nil }); err != nil || out == nil {
		s[0] = 0 // undefined, as a builtin's error is in OPA's non-strict evaluation
		return
	}
	addr, err := w.parse(ctx, w.valueParse, []byte(out.String()))
	if err != nil {
		panic(fmt.Errorf("opa_builtin: result: %w", err))
	}
	s[0] = uint64(addr)
}

// term reads an argument as opa_value_dump wrote it: JSON unless it holds a set, which
// only OPA's parser reads (several times slower).
func (w *wasmAdmission) term(dump []byte) *ast.Term {
	var x any
	if err := util.UnmarshalJSON(dump, &x); err == nil {
		if v, err := ast.InterfaceToValue(x); err == nil {
			return ast.NewTerm(v)
		}
	}
	body, err := ast.ParseBodyWithOpts(string(dump), w.parser)
	if err != nil {
		panic(fmt.Errorf("opa_builtin: argument: %w", err))
	}
	t, ok := body[0].Terms.(*ast.Term)
	if len(body) != 1 || !ok {
		panic(fmt.Errorf("opa_builtin: argument is not a value: %v", body))
	}
	return t
}

// eval runs opa_eval on input (JSON) and answers the result set's JSON,
// [{"result": <package document>}], valid until the next eval.
func (w *wasmAdmission) eval(ctx context.Context, input []byte) ([]byte, error) {
	end := uint64(w.inputAddr) + uint64(len(input))
	if end > uint64(w.mem.Size()) {
		if _, ok := w.mem.Grow(uint32((end - uint64(w.mem.Size()) + 65535) / 65536)); !ok {
			return nil, fmt.Errorf("input of %d bytes does not fit the module's memory", len(input))
		}
	}
	w.mem.Write(w.inputAddr, input)
	// opa_eval(reserved, entrypoint, data, input, input_len, heap_ptr, format 0 = JSON)
	s := w.stack[:]
	s[0], s[1], s[2], s[3], s[4], s[5], s[6] = 0, uint64(w.entrypoint), uint64(w.dataAddr), uint64(w.inputAddr), uint64(len(input)), end, 0
	if err := w.opaEval.CallWithStack(ctx, s); err != nil {
		return nil, fmt.Errorf("opa_eval: %w", err)
	}
	out := w.cstring(uint32(s[0]))
	if out == nil {
		return nil, errors.New("opa_eval: unreadable result")
	}
	return out, nil
}

// admit answers the package document for in, as the Go evaluator's eval does (sets as
// arrays, numbers as json.Number).
func (w *wasmAdmission) admit(ctx context.Context, in session.AdmissionInput) (map[string]any, error) {
	raw, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	out, err := w.eval(ctx, raw)
	if err != nil {
		return nil, err
	}
	var rs []struct {
		Result map[string]any `json:"result"`
	}
	d := json.NewDecoder(bytes.NewReader(out))
	d.UseNumber()
	if err := d.Decode(&rs); err != nil {
		return nil, fmt.Errorf("opa_eval result: %w", err)
	}
	if len(rs) == 0 || rs[0].Result == nil {
		return map[string]any{}, nil
	}
	return rs[0].Result, nil
}

// goAdmission answers the Go evaluator's package document for in, as Admit evaluates the
// shipped policy.
func goAdmission(tb testing.TB) func(context.Context, session.AdmissionInput) (map[string]any, error) {
	p := &policy{Version: Version{ID: shippedID, Mode: ModeEnforce}, compiled: compileShipped(tb)}
	e := &Engine{}
	return func(ctx context.Context, in session.AdmissionInput) (map[string]any, error) {
		ev := e.begin(ctx, in.ProjectID, PointAdmission, admissionValue(in))
		defer ev.done()
		return ev.eval(ctx, p)
	}
}

func newShippedWasm(tb testing.TB) *wasmAdmission {
	ctx := context.Background()
	policy, err := wasmOfShippedAdmission(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	w, err := newWasmAdmission(ctx, policy)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = w.Close(ctx) })
	return w
}

// admissionCases are admission_test.rego's inputs, and the benchmark's.
func admissionCases() map[string]session.AdmissionInput {
	in := func(active int64, concurrency int, tier int, idle *int, md map[string]string) session.AdmissionInput {
		return session.AdmissionInput{Request: session.CreateRequest{Tier: &tier, Template: "tpl_dev_polyglot", IdleTimeoutS: idle, Metadata: md},
			ProjectID: "proj_test", Plan: session.Plan{Concurrency: concurrency, RatePerSec: 10}, Active: active}
	}
	n := func(v int) *int { return &v }
	return map[string]session.AdmissionInput{
		"bench":                 benchInput(),
		"below limit":           in(1, 10, 2, nil, nil),
		"at limit":              in(10, 10, 2, nil, nil),
		"over limit":            in(12, 10, 1, nil, nil),
		"unlimited":             in(500, 0, 1, nil, nil),
		"80 percent":            in(7, 10, 2, nil, nil),
		"below 80 percent":      in(6, 10, 2, nil, nil),
		"last slot":             in(9, 10, 2, nil, nil),
		"reserved metadata":     in(0, 10, 2, nil, map[string]string{"wb.owner": "x", "wb.a": "y", "team": "a"}),
		"long idle on tier 3":   in(0, 10, 3, n(7200), nil),
		"long idle on tier 2":   in(0, 10, 2, n(7200), nil),
		"tier 4 defaults idle":  in(0, 10, 4, nil, nil),
		"tier 4 explicit idle":  in(0, 10, 4, n(600), nil),
		"everything at once":    in(25, 20, 4, n(7200), map[string]string{"wb.x": "1"}),
		"no tier (null)":        {ProjectID: "proj_test", Plan: session.Plan{Concurrency: 5}, Active: 4},
		"quote in metadata key": in(0, 10, 2, nil, map[string]string{`wb."q"`: "x"}),
	}
}

// sortedSets orders the arrays a package document's sets became, for comparison.
func sortedSets(doc map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range doc {
		if a, ok := v.([]any); ok {
			a = slices.Clone(a)
			slices.SortFunc(a, func(x, y any) int { return strings.Compare(text(x), text(y)) })
			v = a
		}
		out[k] = v
	}
	return out
}

// TestWasmAdmissionMatchesGo: the Wasm build of the shipped admission policy decides as
// the Go evaluator does on the policy tests' inputs, so the benchmark compares like with like.
func TestWasmAdmissionMatchesGo(t *testing.T) {
	ctx := context.Background()
	w := newShippedWasm(t)
	goEval := goAdmission(t)
	for name, in := range admissionCases() {
		want, err := goEval(ctx, in)
		if err != nil {
			t.Fatalf("%s: go: %v", name, err)
		}
		got, err := w.admit(ctx, in)
		if err != nil {
			t.Fatalf("%s: wasm: %v", name, err)
		}
		for k := range got { // the engine reads only these rules; the Wasm build answers all
			if !slices.Contains(readRules[PointAdmission], k) {
				delete(got, k)
			}
		}
		if !reflect.DeepEqual(sortedSets(got), sortedSets(want)) {
			t.Errorf("%s:\nwasm %v\ngo   %v", name, got, want)
		}
	}
}

// BenchmarkShippedAdmissionWasm: BenchmarkShippedAdmissionEval's input and checks, through
// the Wasm build under wazero; input encoding (JSON) and result decoding included.
func BenchmarkShippedAdmissionWasm(b *testing.B) {
	ctx := context.Background()
	w := newShippedWasm(b)
	in := benchInput()
	timed(b, func() {
		doc, err := w.admit(ctx, in)
		if err != nil || len(messages(doc["warn"])) != 1 {
			b.Fatalf("%v %v", doc, err)
		}
	})
}

// BenchmarkShippedAdmissionWasmEvalOnly: opa_eval alone, on input already encoded, the
// result left as JSON: the floor of the Wasm path. With the benchmark's input the policy
// warns, calling sprintf back in Go; with one session active it calls no builtin.
func BenchmarkShippedAdmissionWasmEvalOnly(b *testing.B) {
	ctx := context.Background()
	quiet := benchInput()
	quiet.Active = 1
	for _, c := range []struct {
		name string
		in   session.AdmissionInput
		want string
	}{{"sprintf", benchInput(), "soft limit"}, {"nobuiltin", quiet, `"warn":[]`}} {
		b.Run(c.name, func(b *testing.B) {
			w := newShippedWasm(b)
			raw, err := json.Marshal(c.in)
			if err != nil {
				b.Fatal(err)
			}
			timed(b, func() {
				if out, err := w.eval(ctx, raw); err != nil || !bytes.Contains(out, []byte(c.want)) {
					b.Fatalf("%s %v", out, err)
				}
			})
		})
	}
}

// BenchmarkAdmissionInputJSON: the machine's baseline for these figures, the benchmark's
// input encoded to JSON and decoded into a map.
func BenchmarkAdmissionInputJSON(b *testing.B) {
	in := benchInput()
	timed(b, func() {
		raw, err := json.Marshal(in)
		if err != nil {
			b.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil || len(m) != 4 {
			b.Fatalf("%v %v", m, err)
		}
	})
}
