package plugins

import (
	"fmt"
	"slices"
)

// MaxStackBytes bounds a call's stack: the frames of the functions active at once, each
// counted at frameCost (an upper bound of what wazero's compiled code takes for it). wazero
// keeps a call's stack in the host's Go heap, outside the memory cap, and grows it, doubling,
// up to a ceiling of its own that no setting lowers (50 MB, so an allocation of about 100 MiB,
// and 160 MiB allocated on the way): a plugin recursing without end had every call of it take
// that. With this bound a call's stack stays under twice it. Go's output is far inside it
// (ABI.md, "Instances and calls").
const MaxStackBytes = 8 << 20

// keptStackBytes: a call whose count passed it may have grown a stack the host does not keep.
// wazero keeps a function's stack, grown as deep as its calls went, for its next call; past
// this count the instance takes fresh functions after the call (costing about 20 KiB), and the
// grown stack goes with the old ones. So an instance keeps at most twice it of stack for each
// of alloc and decide: MaxStackBytes in all (in practice a tenth of that: wazero's frames are
// under a quarter of their count). Go's output counts at most about 1.3 MiB.
const keptStackBytes = MaxStackBytes / 4

// Names the host adds to a module's exports (ABI.md: a module may not export them).
const (
	// stackExport is the global that counts the stack's bytes (stackBound).
	stackExport = "wb.stack"
	// deepExport is the global that a function starting with the count past keptStackBytes
	// sets to 1.
	deepExport = "wb.deep"
	// startExport is the module's start function, which the host runs itself after
	// instantiating, so that a failure in it can be told from the stack bound's.
	startExport = "wb.start"
)

// frameCost is what one frame of a function counts against MaxStackBytes: 16 bytes for each
// parameter, result, local and value its code makes (the compiler spills each value to a
// slot of its own, of at most 16 bytes: code counts a value per byte, for most instructions
// make at most one, plus the results of each call, which a call of 2 bytes may make hundreds
// of), as many for the arguments and results of the largest call it makes and for each local
// it sets in each of its blocks (where paths join, each such local is a value of its own: 200
// locals set in 200 nested loops made frames of 320 KiB from 7 KiB of code), and 1 KiB for
// saved registers and the return address; and 64 bytes for each parameter and result of its
// blocks (a loop's parameters are values of their own at its head, a block's results at its
// end, and a block type may name a function type of thousands of values in a byte: 60 loops
// of 1,000 v128 parameters made frames of 940 KiB from 6 KiB of code). wazero's frames of
// those come to near 16 bytes a value, and its stack, growing by doubling, allocates up to
// four times what it uses: four slots keep its frames under a quarter of their count, as for
// the other values (keptStackBytes), and a call's allocation under twice MaxStackBytes.
func frameCost(params, results, locals, code, callSlots, setLocals, controls, blockValues int) int {
	return 16*(params+results+locals+code+callSlots+setLocals*(3*controls+1)+4*blockValues) + 1024
}

// boundStack answers wasm rewritten so that a call's stack is bounded (MaxStackBytes): a
// mutable global, exported as stackExport, counts the frames' cost; each function adds its
// own cost when it starts and traps (unreachable) when the count passes the bound (and sets
// a second global, exported as deepExport, to 1 when it passes keptStackBytes); and each
// call site saves the count in a local of the caller and puts it back when the callee
// returns, so that no return path needs to be found. The host sets the count to 0 before
// each call it makes into the module, and after a trap a count over the bound names the
// cause. A start section is exported as startExport instead, for the host to call. Code that
// reads or writes a local or a global the module does not have (which the added ones would
// answer to) is refused, as is an instruction this host does not know.
func boundStack(wasm []byte) ([]byte, error) {
	type section struct {
		id   byte
		body []byte
	}
	var secs []section
	r := &reader{b: wasm, i: 8}
	for r.i < len(r.b) && r.err == nil {
		id := r.byte()
		body := r.bytes(r.uleb())
		if r.err == nil {
			secs = append(secs, section{id, body})
		}
	}
	if r.err != nil {
		return nil, invalid("malformed module: %v", r.err)
	}
	var types []funcType
	var funcTypes []uint64 // of every function, imported ones first
	imported, globals := 0, 0
	start := -1
	var code []byte
	for _, s := range secs {
		sr := &reader{b: s.body}
		switch s.id {
		case 1:
			n := sr.uleb()
			for i := uint64(0); i < n && sr.err == nil; i++ {
				if form := sr.byte(); form != 0x60 && sr.err == nil {
					return nil, invalid("type %d has the form %#x: only function types are supported", i, form)
				}
				p := sr.uleb()
				sr.bytes(p)
				res := sr.uleb()
				sr.bytes(res)
				types = append(types, funcType{int(p), int(res)})
			}
		case 2:
			n := sr.uleb()
			for i := uint64(0); i < n && sr.err == nil; i++ {
				sr.name()
				sr.name()
				switch kind := externKind(sr.byte()); kind {
				case externFunc:
					funcTypes = append(funcTypes, sr.uleb())
					imported++
				case externTable:
					sr.byte()
					sr.limits()
				case externMemory:
					sr.limits()
				case externGlobal:
					sr.byte()
					sr.byte()
					globals++
				default:
					return nil, invalid("imports a %s: not supported", kind)
				}
			}
		case 3:
			n := sr.uleb()
			for i := uint64(0); i < n && sr.err == nil; i++ {
				funcTypes = append(funcTypes, sr.uleb())
			}
		case 6:
			globals += int(sr.uleb())
		case 7:
			n := sr.uleb()
			for i := uint64(0); i < n && sr.err == nil; i++ {
				if name := sr.name(); name == stackExport || name == deepExport || name == startExport {
					return nil, invalid("exports %q, a name the host keeps for itself", name)
				}
				sr.byte()
				sr.uleb()
			}
		case 8:
			start = int(sr.uleb())
		case 10:
			code = s.body
		}
		if sr.err != nil {
			return nil, invalid("malformed section %d: %v", s.id, sr.err)
		}
	}
	for _, t := range funcTypes {
		if t >= uint64(len(types)) {
			return nil, invalid("a function has the type %d, which the module does not define", t)
		}
	}
	g := uint64(globals) // the counter's index; the deep flag's is g+1
	newCode, err := boundCode(code, imported, funcTypes, types, g)
	if err != nil {
		return nil, err
	}

	counter := []byte{0x7f, 1, 0x41, 0, 0x0b}   // (mut i32) (i32.const 0)
	counters := slices.Concat(counter, counter) // the count, the deep flag
	out := slices.Clip(wasm[:8:8])
	put := func(id byte, body []byte) {
		out = append(out, id)
		out = uleb128(out, uint64(len(body)))
		out = append(out, body...)
	}
	addedGlobal := false
	for _, s := range secs {
		switch {
		case s.id == 6:
			sr := &reader{b: s.body}
			n := sr.uleb()
			put(6, slices.Concat(uleb128(nil, n+2), s.body[sr.i:], counters))
			addedGlobal = true
			continue
		case !addedGlobal && s.id >= 7 && s.id <= 12:
			put(6, slices.Concat(uleb128(nil, 2), counters))
			addedGlobal = true
		}
		switch s.id {
		case 7:
			sr := &reader{b: s.body}
			n := sr.uleb()
			exports := slices.Concat(s.body[sr.i:], nameBytes(stackExport), []byte{byte(externGlobal)}, uleb128(nil, g),
				nameBytes(deepExport), []byte{byte(externGlobal)}, uleb128(nil, g+1))
			if start >= 0 {
				n++
				exports = slices.Concat(exports, nameBytes(startExport), []byte{byte(externFunc)}, uleb128(nil, uint64(start)))
			}
			put(7, slices.Concat(uleb128(nil, n+2), exports))
		case 8:
			// Exported as startExport above.
		case 10:
			put(10, newCode)
		default:
			put(s.id, s.body)
		}
	}
	return out, nil
}

// funcType is what boundStack needs of a function type.
type funcType struct{ params, results int }

// nameBytes encodes a name.
func nameBytes(s string) []byte { return append(uleb128(nil, uint64(len(s))), s...) }

// boundCode rewrites the code section for boundStack: in each function, a local to save the
// counter (global g) in, the check at its start (setting the deep flag, global g+1), and the
// saving and restoring around each call. funcTypes are the type indices of every function, imported ones first (all checked
// against types).
func boundCode(code []byte, imported int, funcTypes []uint64, types []funcType, g uint64) ([]byte, error) {
	if code == nil {
		return nil, nil
	}
	r := &reader{b: code}
	n := r.uleb()
	out := uleb128(nil, n)
	joins := 0
	for i := uint64(0); i < n && r.err == nil; i++ {
		body := r.bytes(r.uleb())
		if r.err != nil {
			break
		}
		fi := uint64(imported) + i
		if fi >= uint64(len(funcTypes)) {
			return nil, invalid("defines more function bodies than functions")
		}
		t := types[funcTypes[fi]]
		f := &reader{b: body}
		groups := f.uleb()
		groupsEnd := f.i // the count may be longer than its minimal encoding (valid LEB128)
		locals := uint64(0)
		for j := uint64(0); j < groups && f.err == nil; j++ {
			locals += f.uleb()
			f.byte()
		}
		if f.err != nil {
			return nil, invalid("malformed code section: function %d: %v", i, f.err)
		}
		declEnd := f.i
		nlocals := uint64(t.params) + locals // the save local's index
		sc, err := scanCode(f, nlocals, g, t.results, funcTypes, types)
		if err != nil {
			return nil, invalid("function %d: %v", i, err)
		}
		calls := sc.calls
		if j := sc.setLocals*sc.controls + sc.blockValues + sc.branchValues; j > MaxFunctionJoins {
			return nil, invalid("function %d has %d joins (%d locals set across %d blocks, and block parameters, results and values branched with: %d), more than the %d joins a function may have: split it",
				i, j, sc.setLocals, sc.controls, sc.blockValues+sc.branchValues, MaxFunctionJoins)
		} else if joins += joinWeight(j); joins > MaxJoins {
			return nil, invalid("its functions set locals across blocks and pass values to blocks (joins, weighed by their square past %d a function) %d times or more, more than the %d a plugin's functions may have together",
				joinsLinear, joins, MaxJoins)
		}
		cost := frameCost(t.params, t.results, int(locals)+1, len(body)-declEnd+sc.callResults, sc.callSlots, sc.setLocals, sc.controls, sc.blockValues)
		if cost > MaxStackBytes {
			return nil, invalid("function %d's frame counts %d bytes (its %d locals set across %d blocks), more than the %d MiB a call's stack may have",
				i, cost, sc.setLocals, sc.controls, MaxStackBytes>>20)
		}

		nb := uleb128(nil, groups+1)
		nb = append(nb, body[groupsEnd:declEnd]...)
		nb = append(nb, 1, 0x7f) // the save local
		// global.get g; i32.const cost; i32.add; local.tee s; global.set g;
		// local.get s; i32.const keptStackBytes; i32.gt_u; if
		//   local.get s; i32.const MaxStackBytes; i32.gt_u; if unreachable end
		//   i32.const 1; global.set g+1
		// end
		// (one comparison on the common path, as with the bound's alone).
		nb = append(nb, 0x23)
		nb = uleb128(nb, g)
		nb = append(nb, 0x41)
		nb = sleb128(nb, int64(cost))
		nb = append(nb, 0x6a, 0x22)
		nb = uleb128(nb, nlocals)
		nb = append(nb, 0x24)
		nb = uleb128(nb, g)
		nb = append(nb, 0x20)
		nb = uleb128(nb, nlocals)
		nb = append(nb, 0x41)
		nb = sleb128(nb, keptStackBytes)
		nb = append(nb, 0x4b, 0x04, 0x40)
		nb = append(nb, 0x20)
		nb = uleb128(nb, nlocals)
		nb = append(nb, 0x41)
		nb = sleb128(nb, MaxStackBytes)
		nb = append(nb, 0x4b, 0x04, 0x40, 0x00, 0x0b)
		nb = append(nb, 0x41, 1, 0x24)
		nb = uleb128(nb, g+1)
		nb = append(nb, 0x0b)
		at := declEnd
		for _, c := range calls {
			nb = append(nb, body[at:c[0]]...)
			nb = append(nb, 0x23) // global.get g; local.set s
			nb = uleb128(nb, g)
			nb = append(nb, 0x21)
			nb = uleb128(nb, nlocals)
			nb = append(nb, body[c[0]:c[1]]...)
			nb = append(nb, 0x20) // local.get s; global.set g
			nb = uleb128(nb, nlocals)
			nb = append(nb, 0x24)
			nb = uleb128(nb, g)
			at = c[1]
		}
		nb = append(nb, body[at:]...)
		if len(nb) > MaxFunctionBodyBytes {
			return nil, invalid("function %d is %d bytes of code once the host's stack checks are added around its %d calls, more than the %d KiB a function may have: split it",
				i, len(nb), len(calls), MaxFunctionBodyBytes>>10)
		}
		out = uleb128(out, uint64(len(nb)))
		out = append(out, nb...)
	}
	if r.err != nil {
		return nil, invalid("malformed code section: %v", r.err)
	}
	return out, nil
}

// sleb128 appends v to b as a signed LEB128 number.
func sleb128(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 && c&0x40 == 0 || v == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// scanned is what scanCode finds in a function's code.
type scanned struct {
	calls       [][2]int // where each call is: [start, end) in the body's bytes
	callSlots   int      // the most call slots (parameters and results) a call takes
	callResults int      // the results of all its calls: a call of 2 bytes may make hundreds of values
	setLocals   int      // how many of its locals (parameters included) it sets
	controls    int      // its block, loop, if and else instructions
	// blockValues: the parameters and results of its blocks, loops and ifs (by their block
	// types), and branchValues the values its branches pass (for each br and br_if, and for
	// each label of a br_table, its target's parameters if a loop, else its results): values
	// where paths join, like the locals set across blocks, which a block type of thousands
	// of values makes from a byte or two.
	blockValues  int
	branchValues int
}

// scanCode steps over a function's instructions (f is past its locals). It refuses local
// indices from nlocals on and global indices from g on (the ones boundStack adds), and an
// instruction it does not know. results is the function's (what a branch to its body passes).
func scanCode(f *reader, nlocals, g uint64, results int, funcTypes []uint64, types []funcType) (scanned, error) {
	var sc scanned
	typeOf := func(ti uint64) funcType {
		if ti >= uint64(len(types)) {
			return funcType{} // refused by the compiler
		}
		return types[ti]
	}
	funcOf := func(fn uint64) funcType {
		if fn >= uint64(len(funcTypes)) {
			return funcType{}
		}
		return typeOf(funcTypes[fn])
	}
	// blockType reads a block type: empty, a value type (one result), or the index of a
	// function type (a non-negative s33, read as unsigned: a negative one of more than a
	// byte is refused by the compiler).
	blockType := func() funcType {
		if c := f.byte(); c == 0x40 || f.err != nil {
			return funcType{}
		} else if c&0xc0 == 0x40 {
			return funcType{results: 1}
		}
		f.i--
		return typeOf(f.uleb())
	}
	// labels holds what a branch to each open block passes, the function's body first.
	labels := []int{results}
	branch := func(l uint64) {
		if l < uint64(len(labels)) {
			sc.branchValues += labels[len(labels)-1-int(l)]
		}
	}
	set := make([]bool, nlocals)
	skip := func() { f.uleb() }
	memarg := func() { f.uleb(); f.uleb() }
	for f.i < len(f.b) && f.err == nil {
		at := f.i
		op := f.byte()
		switch {
		case op == 0x05: // else
			sc.controls++
		case op == 0x0b: // end
			if len(labels) > 0 {
				labels = labels[:len(labels)-1]
			}
		case op == 0x00, op == 0x01, op == 0x0f, op == 0x1a, op == 0x1b,
			op >= 0x45 && op <= 0xc4, op == 0xd1:
		case op >= 0x02 && op <= 0x04: // block, loop, if: a block type
			sc.controls++
			bt := blockType()
			sc.blockValues += bt.params + bt.results
			if op == 0x03 {
				labels = append(labels, bt.params)
			} else {
				labels = append(labels, bt.results)
			}
		case op == 0x0c, op == 0x0d: // br, br_if
			branch(f.uleb())
		case op == 0x25, op == 0x26, op == 0xd0, op == 0xd2, op == 0x3f, op == 0x40:
			skip()
		case op == 0x0e: // br_table
			n := f.uleb()
			for j := uint64(0); j <= n && f.err == nil; j++ {
				branch(f.uleb())
			}
		case op == 0x10: // call
			t := funcOf(f.uleb())
			sc.calls = append(sc.calls, [2]int{at, f.i})
			sc.callSlots = max(sc.callSlots, t.params+t.results)
			sc.callResults += t.results
		case op == 0x11: // call_indirect
			t := typeOf(f.uleb())
			skip()
			sc.calls = append(sc.calls, [2]int{at, f.i})
			sc.callSlots = max(sc.callSlots, t.params+t.results)
			sc.callResults += t.results
		case op == 0x1c: // select t*
			f.bytes(f.uleb())
		case op >= 0x20 && op <= 0x22:
			x := f.uleb()
			if x >= nlocals && f.err == nil {
				return sc, fmt.Errorf("uses the local %d, and it has %d", x, nlocals)
			}
			if op != 0x20 && f.err == nil && !set[x] {
				set[x] = true
				sc.setLocals++
			}
		case op == 0x23, op == 0x24:
			if x := f.uleb(); x >= g && f.err == nil {
				return sc, fmt.Errorf("uses the global %d, and the module has %d", x, g)
			}
		case op >= 0x28 && op <= 0x3e:
			memarg()
		case op == 0x41, op == 0x42:
			skip()
		case op == 0x43:
			f.bytes(4)
		case op == 0x44:
			f.bytes(8)
		case op == 0xfc:
			switch sub := f.uleb(); {
			case sub <= 7:
			case sub == 8:
				skip()
				f.byte()
			case sub == 9, sub == 13, sub == 15, sub == 16, sub == 17:
				skip()
			case sub == 10:
				f.byte()
				f.byte()
			case sub == 11:
				f.byte()
			case sub == 12, sub == 14:
				skip()
				skip()
			default:
				return sc, fmt.Errorf("uses the instruction 0xfc %d, which this host does not run", sub)
			}
		case op == 0xfd:
			switch sub := f.uleb(); {
			case sub <= 11, sub == 92, sub == 93:
				memarg()
			case sub == 12, sub == 13:
				f.bytes(16)
			case sub >= 21 && sub <= 34:
				f.byte()
			case sub >= 84 && sub <= 91:
				memarg()
				f.byte()
			case sub <= 255:
			default:
				return sc, fmt.Errorf("uses the instruction 0xfd %d, which this host does not run", sub)
			}
		default:
			return sc, fmt.Errorf("uses the instruction %#x, which this host does not run", op)
		}
	}
	if f.err != nil {
		return sc, fmt.Errorf("malformed code: %v", f.err)
	}
	return sc, nil
}
