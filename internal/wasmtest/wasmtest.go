// Package wasmtest builds tiny WebAssembly plugins for tests outside package plugins, which
// cannot build Go guests cheaply (each is compiled cold by wazero): a module written byte by
// byte against plugins/ABI.md.
package wasmtest

// ConstPlugin is a plugin whose decide answers result (a JSON result of plugins/ABI.md) to
// every input: it exports memory (one page, result at address 0), alloc (the input goes at
// 1024; inputs must fit in the page) and decide.
func ConstPlugin(result string) []byte {
	const inputAt = 1024
	const i32, i64, end = 0x7f, 0x7e, 0x0b
	body := func(code []byte) []byte {
		b := cat(vec(), code, []byte{end}) // no locals
		return cat(uleb(uint64(len(b))), b)
	}
	out := []byte("\x00asm\x01\x00\x00\x00")
	out = append(out, section(1, vec([]byte{0x60, 1, i32, 1, i32}, []byte{0x60, 2, i32, i32, 1, i64}))...) // types: alloc, decide
	out = append(out, section(3, vec([]byte{0}, []byte{1}))...)                                            // functions
	out = append(out, section(5, vec([]byte{0, 1}))...)                                                    // memory: min 1 page
	out = append(out, section(7, vec(
		cat(wstr("memory"), []byte{2, 0}),
		cat(wstr("alloc"), []byte{0, 0}),
		cat(wstr("decide"), []byte{0, 1}),
	))...)
	out = append(out, section(10, vec(
		body(cat([]byte{0x41}, sleb(inputAt))),            // i32.const inputAt
		body(cat([]byte{0x42}, sleb(int64(len(result))))), // i64.const (0 << 32) | len
	))...)
	out = append(out, section(11, vec(cat([]byte{0, 0x41, 0, end}, wstr(result))))...) // data at 0
	return out
}

func uleb(v uint64) []byte {
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

func sleb(v int64) []byte {
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

func wstr(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func vec(items ...[]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func section(id byte, body []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(body)))...), body...)
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
