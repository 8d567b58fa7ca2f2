package plugins

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero/api"
)

// MaxWasmBytes is the largest module Validate accepts.
const MaxWasmBytes = 10 << 20

// Import module names.
const (
	ModuleWB   = "wb"
	ModuleWASI = "wasi_snapshot_preview1"
)

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

type signature struct{ params, results []api.ValueType }

func (s signature) String() string {
	names := func(ts []api.ValueType) string {
		out := make([]string, len(ts))
		for i, t := range ts {
			out[i] = api.ValueTypeName(t)
		}
		return strings.Join(out, ", ")
	}
	return "(" + names(s.params) + ") -> (" + names(s.results) + ")"
}

func sig(params []api.ValueType, results ...api.ValueType) signature {
	return signature{params, results}
}

// allowedImports are the only functions a plugin may import, with their signatures: the wb
// module and the part of WASI preview 1 that Go's wasip1 runtime needs to start, none of it a
// file system or a socket (ABI.md, "Imports").
var allowedImports = map[string]map[string]signature{
	ModuleWB: {
		"log":        sig([]api.ValueType{i32, i32, i32}),
		"config_get": sig([]api.ValueType{i32, i32, i32, i32}, i32),
	},
	ModuleWASI: {
		"args_get":            sig([]api.ValueType{i32, i32}, i32),
		"args_sizes_get":      sig([]api.ValueType{i32, i32}, i32),
		"environ_get":         sig([]api.ValueType{i32, i32}, i32),
		"environ_sizes_get":   sig([]api.ValueType{i32, i32}, i32),
		"clock_res_get":       sig([]api.ValueType{i32, i32}, i32),
		"clock_time_get":      sig([]api.ValueType{i32, i64, i32}, i32),
		"random_get":          sig([]api.ValueType{i32, i32}, i32),
		"fd_write":            sig([]api.ValueType{i32, i32, i32, i32}, i32),
		"fd_close":            sig([]api.ValueType{i32}, i32),
		"fd_fdstat_get":       sig([]api.ValueType{i32, i32}, i32),
		"fd_fdstat_set_flags": sig([]api.ValueType{i32, i32}, i32),
		"fd_prestat_get":      sig([]api.ValueType{i32, i32}, i32),
		"fd_prestat_dir_name": sig([]api.ValueType{i32, i32, i32}, i32),
		"poll_oneoff":         sig([]api.ValueType{i32, i32, i32, i32}, i32),
		"proc_exit":           sig([]api.ValueType{i32}),
		"sched_yield":         sig(nil, i32),
	},
}

// Exports the host calls.
var requiredExports = map[string]signature{
	"alloc":  sig([]api.ValueType{i32}, i32),
	"decide": sig([]api.ValueType{i32, i32}, i64),
}

// Digest answers "sha256:HEX" of a module.
func Digest(wasm []byte) string {
	sum := sha256.Sum256(wasm)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Validate checks that wasm is a plugin this host can run: at most MaxWasmBytes, imports only
// what ABI.md allows, exports memory, alloc and decide and keeps within the bounds on its
// functions (all checked before compiling), compiles, has the ABI's signatures, and starts
// (its _initialize, when exported, returns within the start timeout). It answers the module's
// digest, or a *ValidationError with the reason. A module refused after compiling leaves
// nothing in the compilation cache.
func (h *Host) Validate(ctx context.Context, wasm []byte) (string, error) {
	digest, m, err := h.validate(ctx, wasm, h.o.MemoryLimitPages, "", "")
	if err != nil {
		return "", err
	}
	h.releaseModule(m)
	return digest, nil
}

// validate is Validate that keeps the compiled module (for pages) for the caller to release.
// project and plugin name the upload in the start's wb.log lines.
func (h *Host) validate(ctx context.Context, wasm []byte, pages uint32, project, plugin string) (string, *module, error) {
	if len(wasm) == 0 {
		return "", nil, invalid("empty module")
	}
	if len(wasm) > MaxWasmBytes {
		return "", nil, invalid("module is %d bytes, more than the %d MiB allowed", len(wasm), MaxWasmBytes>>20)
	}
	imports, err := parseImports(wasm)
	if err != nil {
		return "", nil, invalid("%v", err)
	}
	for _, im := range imports {
		if err := checkImport(im); err != nil {
			return "", nil, err
		}
	}
	if err := checkShape(wasm); err != nil {
		return "", nil, err
	}
	digest := Digest(wasm)
	m, err := h.acquireModule(ctx, project, pages, digest, func(context.Context) ([]byte, error) { return wasm, nil })
	if err != nil {
		var ve *ValidationError
		if errors.As(err, &ve) || errors.Is(err, ErrClosed) {
			return "", nil, err
		}
		if ctx.Err() != nil {
			return "", nil, ctx.Err() // ended while waiting for its turn to compile
		}
		return "", nil, invalid("does not compile: %v", err)
	}
	if err := checkCompiled(m); err != nil {
		h.dropCached(m)
		h.releaseModule(m)
		return "", nil, err
	}
	inst, err := h.newInstance(ctx, m, project, plugin)
	if err != nil {
		if ctx.Err() == nil {
			h.dropCached(m)
		}
		h.releaseModule(m)
		return "", nil, invalid("does not start: %v", err)
	}
	inst.close()
	return digest, m, nil
}

func checkImport(im wasmImport) error {
	name := im.module + "." + im.name
	if im.kind != externFunc {
		return invalid("imports %s %s: a plugin may import only functions (it must define and export its own memory)", im.kind, name)
	}
	fns, ok := allowedImports[im.module]
	if !ok {
		return invalid("imports %s: unknown module %q (a plugin may import only from %q and %q)", name, im.module, ModuleWB, ModuleWASI)
	}
	if _, ok := fns[im.name]; ok {
		return nil
	}
	switch {
	case im.module == ModuleWB:
		return invalid("imports %s: the wb module has only log and config_get", name)
	case strings.HasPrefix(im.name, "sock_"):
		return invalid("imports %s: plugins have no network access", name)
	case strings.HasPrefix(im.name, "path_") || strings.HasPrefix(im.name, "fd_"):
		return invalid("imports %s: plugins have no file system", name)
	}
	allowed := slices.Sorted(func(yield func(string) bool) {
		for n := range fns {
			if !yield(n) {
				return
			}
		}
	})
	return invalid("imports %s: not allowed (the WASI functions allowed are %s)", name, strings.Join(allowed, ", "))
}

func checkCompiled(m *module) error {
	for _, f := range m.cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		want := allowedImports[mod][name]
		got := sig(f.ParamTypes(), f.ResultTypes()...)
		if !slices.Equal(got.params, want.params) || !slices.Equal(got.results, want.results) {
			return invalid("imports %s.%s with the signature %s, want %s", mod, name, got, want)
		}
	}
	if _, ok := m.cm.ExportedMemories()["memory"]; !ok {
		return invalid(`does not export its memory as "memory"`)
	}
	exports := m.cm.ExportedFunctions()
	for _, name := range []string{"alloc", "decide"} {
		f, ok := exports[name]
		want := requiredExports[name]
		if !ok {
			return invalid("does not export the function %s %s", name, want)
		}
		got := sig(f.ParamTypes(), f.ResultTypes()...)
		if !slices.Equal(got.params, want.params) || !slices.Equal(got.results, want.results) {
			return invalid("exports %s with the signature %s, want %s", name, got, want)
		}
	}
	if f, ok := exports["_initialize"]; ok && (len(f.ParamTypes()) > 0 || len(f.ResultTypes()) > 0) {
		return invalid("exports _initialize with the signature %s, want () -> ()", sig(f.ParamTypes(), f.ResultTypes()...))
	}
	if _, ok := exports["_start"]; ok {
		if _, ok := exports["_initialize"]; !ok {
			return invalid("is a WASI command (exports _start): build a reactor, e.g. go build -buildmode=c-shared")
		}
	}
	return nil
}

// The import section, read without compiling, so that a forbidden import is named before any
// work (and imports of tables, memories and globals are named too).

type externKind byte

const (
	externFunc   externKind = 0
	externTable  externKind = 1
	externMemory externKind = 2
	externGlobal externKind = 3
	externTag    externKind = 4
)

func (k externKind) String() string {
	switch k {
	case externFunc:
		return "function"
	case externTable:
		return "table"
	case externMemory:
		return "memory"
	case externGlobal:
		return "global"
	case externTag:
		return "tag"
	}
	return fmt.Sprintf("kind %d", byte(k))
}

type wasmImport struct {
	module, name string
	kind         externKind
}

type reader struct {
	b   []byte
	i   int
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || r.i >= len(r.b) {
		r.err = errors.New("truncated")
		return 0
	}
	c := r.b[r.i]
	r.i++
	return c
}

func (r *reader) uleb() uint64 {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		c := r.byte()
		v |= uint64(c&0x7f) << shift
		if c < 0x80 || r.err != nil {
			return v
		}
	}
	r.err = errors.New("malformed LEB128 number")
	return 0
}

func (r *reader) bytes(n uint64) []byte {
	if r.err != nil || n > uint64(len(r.b)-r.i) {
		r.err = errors.New("truncated")
		return nil
	}
	b := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return b
}

func (r *reader) name() string { return string(r.bytes(r.uleb())) }

func (r *reader) limits() {
	flags := r.byte()
	r.uleb()
	if flags&1 != 0 {
		r.uleb()
	}
}

func parseImports(wasm []byte) ([]wasmImport, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil, errors.New("not a WebAssembly binary module")
	}
	if string(wasm[4:8]) != "\x01\x00\x00\x00" {
		return nil, errors.New("not a WebAssembly core module of version 1 (components are not supported)")
	}
	r := &reader{b: wasm, i: 8}
	for r.i < len(r.b) && r.err == nil {
		id := r.byte()
		body := r.bytes(r.uleb())
		if id != 2 || r.err != nil {
			continue
		}
		s := &reader{b: body}
		n := s.uleb()
		out := make([]wasmImport, 0, min(n, 1024))
		for i := uint64(0); i < n && s.err == nil; i++ {
			im := wasmImport{module: s.name(), name: s.name(), kind: externKind(s.byte())}
			switch im.kind {
			case externFunc:
				s.uleb()
			case externTable:
				s.byte()
				s.limits()
			case externMemory:
				s.limits()
			case externGlobal:
				s.byte()
				s.byte()
			case externTag:
				s.byte()
				s.uleb()
			default:
				s.err = fmt.Errorf("unknown import kind %d", im.kind)
			}
			out = append(out, im)
		}
		if s.err != nil {
			return nil, fmt.Errorf("malformed import section: %w", s.err)
		}
		return out, nil
	}
	if r.err != nil {
		return nil, fmt.Errorf("malformed module: %w", r.err)
	}
	return nil, nil
}

// Bounds on what the compiler is given, checked before it runs. wazero's compile of one
// function holds several hundred times the function's size in the host's heap while it runs
// (a 1 MiB function: +563 MiB), and a module's functions are compiled one after another, so the
// bound on a function's body bounds the peak; the bounds on functions and locals bound the rest
// of its work (at the bounds, 10 MiB of 252 KiB functions compiled in 18 s, +231 MiB at the
// peak). Go's output stays far inside each (ABI.md, "Exports"): an example plugin's ~1,400
// functions, the largest 12 KiB of code, with at most 17 locals.
const (
	// MaxFunctionBodyBytes bounds one function's code.
	MaxFunctionBodyBytes = 256 << 10
	// MaxFunctions bounds the functions a module defines.
	MaxFunctions = 100_000
	// MaxFunctionLocals bounds one function's declared locals, and MaxLocals a module's all
	// together: the compiled code zeroes each local, so 2,000 functions of 50,000 locals, a
	// 23 KiB module, took 768 MiB to compile.
	MaxFunctionLocals = 50_000
	MaxLocals         = 1 << 20
	// MaxFunctionJoins bounds, in one function, the locals it sets times its block, loop, if
	// and else instructions, plus the parameters and results of its blocks (by their block
	// types) and the values its branches pass to them (each br and br_if, each label of a
	// br_table), and MaxJoins the sum over a module's functions, each weighed by joinWeight:
	// where paths join each such local or value is a value of its own, and the compiler's
	// time grows faster than their number (a 7 KiB function setting 200 locals in 200 nested
	// loops took 3.8 s; 10,000 joins, 0.3 s; a 7 KiB one of 60 loops of 1,000 parameters, 10
	// s, and one loop of 1,000 parameters branched to by a br_table of 1,000 labels, 2 s).
	// Go's output has at most about 4,000 in a function and 300,000 in a module (weighed:
	// 320,000), and its blocks take and make at most one value in all. These are checked when
	// the module is rewritten to bound its stack (boundStack), before it is compiled.
	MaxFunctionJoins = 10_000
	MaxJoins         = 2_000_000
	// joinsLinear: a function's compile takes about 5 µs a join up to this many joins, and
	// then its time grows with their square (4,000: 10 µs a join; 9,800: 29 µs), so that 200
	// functions of 10,000 joins, within MaxJoins counted one for one, took a minute.
	joinsLinear = 2_000
)

// joinWeight is what a function of j joins counts against MaxJoins: j, and past joinsLinear
// j×j/joinsLinear, in proportion to its compile time (about 5 µs a unit, so that MaxJoins
// takes about 10 s however a module's functions share it: 2,000 joins a function or 10,000).
func joinWeight(j int) int {
	if j <= joinsLinear {
		return j
	}
	return j * j / joinsLinear
}

// checkShape checks, without compiling, what a module must export (by name and kind: the
// signatures are checked once compiled) and the bounds above, so that a module refused for
// its shape costs the host no compile.
func checkShape(wasm []byte) error {
	r := &reader{b: wasm, i: 8}
	exports := map[string]byte{}
	for r.i < len(r.b) && r.err == nil {
		id := r.byte()
		body := r.bytes(r.uleb())
		if r.err != nil {
			break
		}
		s := &reader{b: body}
		switch id {
		case 7:
			n := s.uleb()
			for i := uint64(0); i < n && s.err == nil; i++ {
				name := s.name()
				kind := s.byte()
				s.uleb()
				if _, ok := exports[name]; !ok && s.err == nil {
					exports[name] = kind
				}
			}
			if s.err != nil {
				return invalid("malformed export section: %v", s.err)
			}
		case 10:
			if err := checkCode(s); err != nil {
				return err
			}
		}
	}
	if r.err != nil {
		return invalid("malformed module: %v", r.err)
	}
	if k, ok := exports["memory"]; !ok || k != byte(externMemory) {
		return invalid(`does not export its memory as "memory"`)
	}
	for _, name := range []string{"alloc", "decide"} {
		if k, ok := exports[name]; !ok || k != byte(externFunc) {
			return invalid("does not export the function %s %s", name, requiredExports[name])
		}
	}
	if k, ok := exports["_initialize"]; ok && k != byte(externFunc) {
		return invalid("exports _initialize as a %s, want the function () -> ()", externKind(k))
	}
	if _, ok := exports["_start"]; ok {
		if _, ok := exports["_initialize"]; !ok {
			return invalid("is a WASI command (exports _start): build a reactor, e.g. go build -buildmode=c-shared")
		}
	}
	return nil
}

// checkCode checks the code section's bounds: how many functions, each one's size and locals.
func checkCode(s *reader) error {
	n := s.uleb()
	if s.err == nil && n > MaxFunctions {
		return invalid("defines %d functions, more than the %d a plugin may have", n, MaxFunctions)
	}
	var total uint64
	for i := uint64(0); i < n && s.err == nil; i++ {
		size := s.uleb()
		if s.err == nil && size > MaxFunctionBodyBytes {
			return invalid("function %d is %d bytes of code, more than the %d KiB a function may have: split it", i, size, MaxFunctionBodyBytes>>10)
		}
		f := &reader{b: s.bytes(size)}
		if s.err != nil {
			break
		}
		var locals uint64
		for groups, j := f.uleb(), uint64(0); j < groups && f.err == nil; j++ {
			locals += f.uleb()
			f.byte()
			if locals > MaxFunctionLocals {
				return invalid("function %d declares more than the %d locals a function may have", i, MaxFunctionLocals)
			}
		}
		if total += locals; total > MaxLocals {
			return invalid("its functions declare more than the %d locals a plugin's functions may have together", MaxLocals)
		}
		if f.err != nil {
			return invalid("malformed code section: function %d: %v", i, f.err)
		}
	}
	if s.err != nil {
		return invalid("malformed code section: %v", s.err)
	}
	return nil
}
