// Package wasmtest builds tiny WebAssembly modules for tests, byte by byte (there is no
// wat2wasm here): the encoding helpers, and ConstPlugin for tests outside package plugins,
// which cannot build Go guests cheaply (each is compiled cold by wazero).
package wasmtest

// ConstPlugin is a plugin whose decide answers result (a JSON result of plugins/ABI.md) to
// every input: it exports memory (one page, result at address 0), alloc (the input goes at
// 1024; inputs must fit in the page) and decide.
func ConstPlugin(result string) []byte {
	const inputAt = 1024
	const i32, i64, end = 0x7f, 0x7e, 0x0b
	body := func(code []byte) []byte {
		b := Cat(Vec(), code, []byte{end}) // no locals
		return Cat(ULEB(uint64(len(b))), b)
	}
	out := []byte("\x00asm\x01\x00\x00\x00")
	out = append(out, Section(1, Vec([]byte{0x60, 1, i32, 1, i32}, []byte{0x60, 2, i32, i32, 1, i64}))...) // types: alloc, decide
	out = append(out, Section(3, Vec([]byte{0}, []byte{1}))...)                                            // functions
	out = append(out, Section(5, Vec([]byte{0, 1}))...)                                                    // memory: min 1 page
	out = append(out, Section(7, Vec(
		Cat(Str("memory"), []byte{2, 0}),
		Cat(Str("alloc"), []byte{0, 0}),
		Cat(Str("decide"), []byte{0, 1}),
	))...)
	out = append(out, Section(10, Vec(
		body(Cat([]byte{0x41}, SLEB(inputAt))),            // i32.const inputAt
		body(Cat([]byte{0x42}, SLEB(int64(len(result))))), // i64.const (0 << 32) | len
	))...)
	out = append(out, Section(11, Vec(Cat([]byte{0, 0x41, 0, end}, Str(result))))...) // data at 0
	return out
}

// ULEB encodes v as unsigned LEB128.
func ULEB(v uint64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// SLEB encodes v as signed LEB128.
func SLEB(v int64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// Str encodes a name: its length, then its bytes.
func Str(s string) []byte { return append(ULEB(uint64(len(s))), s...) }

// Vec encodes a vector: its length, then its items.
func Vec(items ...[]byte) []byte {
	out := ULEB(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

// Section encodes a section of id.
func Section(id byte, body []byte) []byte {
	return append(append([]byte{id}, ULEB(uint64(len(body)))...), body...)
}

// Cat concatenates parts.
func Cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
