package plugins

import "slices"

// MaxTableEntries bounds the entries of a module's tables, all together. wazero keeps a table
// in the host's Go heap (8 bytes an entry), outside the linear memory that MemoryLimitPages
// caps, and table.grow extends it up to the table's declared maximum: without one, up to 2³²−1
// entries, 32 GiB asked of the host in one instruction (a fatal out-of-memory error in Go).
// 2²⁰ entries (8 MiB) is far above what compilers emit (a Go module's one table holds an entry
// per function: tens of thousands).
const MaxTableEntries = 1 << 20

// maxTables bounds how many tables a module defines (compilers emit one).
const maxTables = 16

// boundTables answers wasm with every table's maximum lowered so that the tables together
// hold at most MaxTableEntries: each table may grow by an equal share of what their minimums
// leave. It refuses a module whose minimums alone exceed the bound (wazero would allocate
// them at instantiation), and a table type it does not know. A module whose tables are
// already within their shares is answered as it is.
func boundTables(wasm []byte) ([]byte, error) {
	head, start, end, err := sectionAt(wasm, 4)
	if err != nil || start < 0 {
		return wasm, err
	}
	r := &reader{b: wasm[start:end]}
	type table struct {
		ref      byte
		min, max uint64
		hasMax   bool
	}
	n := r.uleb()
	if n > maxTables {
		return nil, invalid("declares %d tables; a plugin may have at most %d", n, maxTables)
	}
	tables := make([]table, 0, n)
	var sumMin uint64
	for i := uint64(0); i < n && r.err == nil; i++ {
		t := table{ref: r.byte()}
		flags := r.byte()
		t.min = r.uleb()
		if flags == 1 {
			t.max, t.hasMax = r.uleb(), true
		}
		if r.err != nil {
			break
		}
		if t.ref != 0x70 && t.ref != 0x6f {
			return nil, invalid("table %d has the element type %#x: a plugin's tables may hold only funcref or externref", i, t.ref)
		}
		if flags > 1 {
			return nil, invalid("table %d has the limits flags %#x: only 32-bit tables with or without a maximum are supported", i, flags)
		}
		sumMin += t.min
		if sumMin > MaxTableEntries {
			return nil, invalid("its tables declare at least %d entries, more than the %d a plugin's tables may hold", sumMin, MaxTableEntries)
		}
		tables = append(tables, t)
	}
	if r.err != nil || r.i != len(r.b) {
		return nil, invalid("malformed table section")
	}
	if len(tables) == 0 {
		return wasm, nil
	}
	share := (MaxTableEntries - sumMin) / uint64(len(tables))
	body := uleb128(nil, uint64(len(tables)))
	changed := false
	for _, t := range tables {
		limit := t.min + share
		if !t.hasMax || t.max > limit {
			t.max, changed = limit, true
		}
		body = append(body, t.ref, 1)
		body = uleb128(uleb128(body, t.min), t.max)
	}
	if !changed {
		return wasm, nil
	}
	out := slices.Concat(wasm[:head], []byte{4}, uleb128(nil, uint64(len(body))), body, wasm[end:])
	return out, nil
}

// sectionAt answers where wasm's first section of id starts (its id byte), where its body
// starts and where it ends (-1s when it has none).
func sectionAt(wasm []byte, id byte) (head, start, end int, err error) {
	if len(wasm) < 8 {
		return -1, -1, -1, invalid("not a WebAssembly binary module")
	}
	r := &reader{b: wasm, i: 8}
	for r.i < len(r.b) && r.err == nil {
		head = r.i
		sid := r.byte()
		size := r.uleb()
		start = r.i
		r.bytes(size)
		if r.err == nil && sid == id {
			return head, start, r.i, nil
		}
	}
	if r.err != nil {
		return -1, -1, -1, invalid("malformed module: %v", r.err)
	}
	return -1, -1, -1, nil
}

// uleb128 appends v to b as an unsigned LEB128 number.
func uleb128(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
