package plugins

import "wb/internal/wasmtest"

// A tiny WebAssembly encoder for hand-written test modules (there is no wat2wasm here).

const (
	tI32  = 0x7f
	tI64  = 0x7e
	tV128 = 0x7b
)

// Opcodes used by the tests.
const (
	opUnreachable = 0x00
	opBlock       = 0x02
	opLoop        = 0x03
	opIf          = 0x04
	opEnd         = 0x0b
	opBr          = 0x0c
	opBrIf        = 0x0d
	opCall        = 0x10
	opDrop        = 0x1a
	opLocalGet    = 0x20
	opLocalSet    = 0x21
	opLocalTee    = 0x22
	opI32Const    = 0x41
	opI64Const    = 0x42
	opI32Eqz      = 0x45
	opI32Eq       = 0x46
	opI32Sub      = 0x6b
	opMemorySize  = 0x3f
	opMemoryGrow  = 0x40
	blockEmpty    = 0x40
)

// The encoding helpers are shared with tests outside this package.
var (
	uleb    = wasmtest.ULEB
	sleb    = wasmtest.SLEB
	wstr    = wasmtest.Str
	vec     = wasmtest.Vec
	section = wasmtest.Section
	cat     = wasmtest.Cat
)

func i32c(v int32) []byte { return append([]byte{opI32Const}, sleb(int64(v))...) }
func i64c(v int64) []byte { return append([]byte{opI64Const}, sleb(v)...) }

type wimport struct {
	module, name     string
	params, results  []byte
	kind             byte // 0 function (default), 2 memory, 3 global
	memMin, globType byte
}

type wfunc struct {
	name            string // exported under this name when set
	params, results []byte
	locals          int  // i32 locals, or localType's
	localType       byte // of the locals: tI32 when 0
	body            []byte
}

type wdata struct {
	offset int32
	bytes  []byte
}

type wmod struct {
	imports   []wimport
	funcs     []wfunc
	memMin    uint32
	memMax    int64 // -1: none
	noMemory  bool
	memExport string // default "memory"
	data      []wdata
}

func (m wmod) encode() []byte {
	var types, imports, funcs, exports, code [][]byte
	fnType := func(params, results []byte) uint64 {
		types = append(types, cat([]byte{0x60}, vec(bytesEach(params)...), vec(bytesEach(results)...)))
		return uint64(len(types) - 1)
	}
	nImported := 0
	for _, im := range m.imports {
		switch im.kind {
		case 0:
			imports = append(imports, cat(wstr(im.module), wstr(im.name), []byte{0}, uleb(fnType(im.params, im.results))))
			nImported++
		case 2:
			imports = append(imports, cat(wstr(im.module), wstr(im.name), []byte{2, 0}, uleb(uint64(im.memMin))))
		case 3:
			imports = append(imports, cat(wstr(im.module), wstr(im.name), []byte{3, tI32, 0}))
		}
	}
	for i, f := range m.funcs {
		funcs = append(funcs, uleb(fnType(f.params, f.results)))
		if f.name != "" {
			exports = append(exports, cat(wstr(f.name), []byte{0}, uleb(uint64(nImported+i))))
		}
		locals := vec()
		if f.locals > 0 {
			lt := f.localType
			if lt == 0 {
				lt = tI32
			}
			locals = vec(cat(uleb(uint64(f.locals)), []byte{lt}))
		}
		body := cat(locals, f.body, []byte{opEnd})
		code = append(code, cat(uleb(uint64(len(body))), body))
	}
	var mem []byte
	if !m.noMemory {
		if m.memMax >= 0 {
			mem = section(5, vec(cat([]byte{1}, uleb(uint64(m.memMin)), uleb(uint64(m.memMax)))))
		} else {
			mem = section(5, vec(cat([]byte{0}, uleb(uint64(m.memMin)))))
		}
		name := m.memExport
		if name == "" {
			name = "memory"
		}
		exports = append(exports, cat(wstr(name), []byte{2, 0}))
	}
	var data [][]byte
	for _, d := range m.data {
		data = append(data, cat([]byte{0}, i32c(d.offset), []byte{opEnd}, wstr(string(d.bytes))))
	}
	out := []byte("\x00asm\x01\x00\x00\x00")
	out = append(out, section(1, vec(types...))...)
	if len(imports) > 0 {
		out = append(out, section(2, vec(imports...))...)
	}
	out = append(out, section(3, vec(funcs...))...)
	out = append(out, mem...)
	out = append(out, section(7, vec(exports...))...)
	out = append(out, section(10, vec(code...))...)
	if len(data) > 0 {
		out = append(out, section(11, vec(data...))...)
	}
	return out
}

func bytesEach(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i, c := range b {
		out[i] = []byte{c}
	}
	return out
}

// Input is written at inputAt; results live from 0.
const inputAt = 1024

func allocFunc() wfunc {
	return wfunc{name: "alloc", params: []byte{tI32}, results: []byte{tI32}, body: i32c(inputAt)}
}

// resultAt0 answers (0 << 32) | n: the n bytes at address 0.
func resultAt0(n int) []byte { return i64c(int64(n)) }

func decideFunc(body []byte) wfunc {
	return wfunc{name: "decide", params: []byte{tI32, tI32}, results: []byte{tI64}, locals: 1, body: body}
}

// rawPlugin is a module whose decide runs body (which must leave an i64) with out stored at 0.
func rawPlugin(out string, body []byte) []byte {
	return wmod{memMin: 1, memMax: -1, funcs: []wfunc{allocFunc(), decideFunc(body)},
		data: []wdata{{0, []byte(out)}}}.encode()
}

// constPlugin answers out.
func constPlugin(out string) []byte { return rawPlugin(out, resultAt0(len(out))) }

// spinPlugin counts down from n (local 2) then answers out.
func spinPlugin(out string, n int32) []byte {
	body := cat(
		i32c(n), []byte{opLocalSet, 2},
		[]byte{opLoop, blockEmpty},
		[]byte{opLocalGet, 2}, i32c(1), []byte{opI32Sub, opLocalTee, 2},
		[]byte{opBrIf, 0},
		[]byte{opEnd},
		resultAt0(len(out)),
	)
	return rawPlugin(out, body)
}

// logSpinPlugin logs "start" through wb.log, then spins like spinPlugin.
func logSpinPlugin(out string, n int32) []byte {
	const msgAt = 512
	body := cat(
		i32c(1), i32c(msgAt), i32c(5), []byte{opCall, 0},
		i32c(n), []byte{opLocalSet, 2},
		[]byte{opLoop, blockEmpty},
		[]byte{opLocalGet, 2}, i32c(1), []byte{opI32Sub, opLocalTee, 2},
		[]byte{opBrIf, 0},
		[]byte{opEnd},
		resultAt0(len(out)),
	)
	return wmod{memMin: 1, memMax: -1,
		imports: []wimport{{module: "wb", name: "log", params: []byte{tI32, tI32, tI32}}},
		funcs:   []wfunc{allocFunc(), decideFunc(body)},
		data:    []wdata{{0, []byte(out)}, {msgAt, []byte("start")}}}.encode()
}
