package sdk

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// A small JSON decoder for the input's known shape, without reflection.

type decoder struct {
	b    []byte
	i    int
	err  error
	ints []int // backing store of intPtr
}

const maxDepth = 64

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = errors.New(msg + " at offset " + strconv.Itoa(d.i))
	}
	d.i = len(d.b) // stop everything
}

func (d *decoder) ws() {
	// The host writes compact JSON: answer without entering the loop (every loop iteration
	// costs a termination check under the host's deadline).
	if d.i >= len(d.b) || d.b[d.i] > ' ' {
		return
	}
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) peek() byte {
	d.ws()
	if d.i >= len(d.b) {
		return 0
	}
	return d.b[d.i]
}

func (d *decoder) expect(c byte) {
	if d.peek() != c {
		d.fail("expected " + strconv.QuoteRune(rune(c)))
		return
	}
	d.i++
}

// null consumes a null and reports whether there was one.
func (d *decoder) null() bool {
	if d.peek() == 'n' {
		d.literal("null")
		return true
	}
	return false
}

func (d *decoder) literal(s string) {
	if len(d.b)-d.i < len(s) || string(d.b[d.i:d.i+len(s)]) != s {
		d.fail("invalid literal")
		return
	}
	d.i += len(s)
}

// object calls f for each key; f must consume the value. The key is a view (see view).
func (d *decoder) object(f func(key string)) {
	if d.null() {
		return
	}
	d.expect('{')
	if d.peek() == '}' {
		d.i++
		return
	}
	for d.err == nil {
		key := d.str()
		d.expect(':')
		if d.err != nil {
			return
		}
		f(key)
		switch d.peek() {
		case ',':
			d.i++
		case '}':
			d.i++
			return
		default:
			d.fail("expected , or } in object")
		}
	}
}

func (d *decoder) str() string {
	if d.peek() != '"' {
		d.fail("expected a string")
		return ""
	}
	d.i++
	start := d.i
	// Find the first quote, backslash or control character 8 bytes at a time: every loop
	// iteration costs a termination check under the host's deadline.
	for len(d.b)-d.i >= 8 {
		if m := special8(binary.LittleEndian.Uint64(d.b[d.i:])); m != 0 {
			d.i += bits.TrailingZeros64(m) >> 3
			break
		}
		d.i += 8
	}
	for d.i < len(d.b) {
		c := d.b[d.i]
		if c == '"' {
			s := d.view(start, d.i)
			d.i++
			return s
		}
		if c == '\\' {
			return d.strEscaped(start)
		}
		if c < 0x20 {
			d.fail("control character in string")
			return ""
		}
		d.i++
	}
	d.fail("unterminated string")
	return ""
}

// view answers b[i:j] as a string without copying: the input buffer belongs to this call
// alone (alloc makes a new one each time) and is never written again, so the strings stay
// valid for as long as the plugin keeps them.
func (d *decoder) view(i, j int) string {
	if i == j {
		return ""
	}
	return unsafe.String(&d.b[i], j-i)
}

// special8 answers a mask whose lowest set bit is in the first of the 8 bytes of w (little
// endian) that is '"', '\\' or below 0x20, or 0 if there is none. (The classic zero-byte test:
// it may flag bytes after a real match, never before one.)
func special8(w uint64) uint64 {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	hasZero := func(x uint64) uint64 { return (x - lo) & ^x & hi }
	return hasZero(w^(lo*'"')) | hasZero(w^(lo*'\\')) | ((w - lo*0x20) & ^w & hi)
}

func (d *decoder) strEscaped(start int) string {
	out := append([]byte(nil), d.b[start:d.i]...)
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return string(out)
		case c < 0x20:
			d.fail("control character in string")
			return ""
		case c != '\\':
			out = append(out, c)
			d.i++
			continue
		}
		if d.i+1 >= len(d.b) {
			break
		}
		e := d.b[d.i+1]
		d.i += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := d.hex4()
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if d.i+1 < len(d.b) && d.b[d.i] == '\\' && d.b[d.i+1] == 'u' {
					d.i += 2
					r2 = d.hex4()
				}
				r = utf16.DecodeRune(r, r2)
			}
			out = utf8.AppendRune(out, r)
		default:
			d.fail("invalid escape")
			return ""
		}
	}
	d.fail("unterminated string")
	return ""
}

func (d *decoder) hex4() rune {
	if len(d.b)-d.i < 4 {
		d.fail("short \\u escape")
		return utf8.RuneError
	}
	var r rune
	for _, c := range d.b[d.i : d.i+4] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			d.fail("invalid \\u escape")
			return utf8.RuneError
		}
	}
	d.i += 4
	return r
}

// numberBytes consumes a JSON number and answers its text.
func (d *decoder) numberBytes() []byte {
	d.ws()
	start := d.i
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case '0' <= c && c <= '9', c == '-', c == '+', c == '.', c == 'e', c == 'E':
			d.i++
			continue
		}
		break
	}
	if start == d.i {
		d.fail("expected a number")
	}
	return d.b[start:d.i]
}

func (d *decoder) float() float64 {
	t := d.numberBytes()
	if d.err != nil {
		return 0
	}
	f, err := strconv.ParseFloat(string(t), 64)
	if err != nil {
		d.fail("invalid number")
	}
	return f
}

// int64 accepts integral numbers, including 1e3 and 2.0.
func (d *decoder) int64() int64 {
	if d.null() {
		return 0
	}
	t := d.numberBytes()
	if d.err != nil {
		return 0
	}
	var n int64
	neg, digits := false, t
	if len(digits) > 0 && digits[0] == '-' {
		neg, digits = true, digits[1:]
	}
	simple := len(digits) > 0 && len(digits) < 19
	for _, c := range digits {
		if c < '0' || c > '9' {
			simple = false
			break
		}
		n = n*10 + int64(c-'0')
	}
	if simple {
		if neg {
			n = -n
		}
		return n
	}
	f, err := strconv.ParseFloat(string(t), 64)
	if err != nil || f != float64(int64(f)) {
		d.fail("expected an integer")
		return 0
	}
	return int64(f)
}

func (d *decoder) int() int { return int(d.int64()) }

// intPtr answers a pointer to an integer, nil for null. The integers of one input share one
// allocation.
func (d *decoder) intPtr() *int {
	if d.null() {
		return nil
	}
	if len(d.ints) == cap(d.ints) {
		d.ints = make([]int, 0, 8)
	}
	d.ints = append(d.ints, d.int())
	return &d.ints[len(d.ints)-1]
}

func (d *decoder) boolean() bool {
	switch d.peek() {
	case 't':
		d.literal("true")
		return true
	case 'f':
		d.literal("false")
		return false
	}
	d.fail("expected a boolean")
	return false
}

// optStr answers a string or "" for null.
func (d *decoder) optStr() string {
	if d.null() {
		return ""
	}
	return d.str()
}

func (d *decoder) strMap() map[string]string {
	if d.null() {
		return nil
	}
	m := map[string]string{}
	d.object(func(k string) { m[k] = d.optStr() })
	return m
}

// value decodes any JSON value as encoding/json would into an any.
func (d *decoder) value(depth int) any {
	if depth > maxDepth {
		d.fail("nested too deep")
		return nil
	}
	switch c := d.peek(); {
	case c == '{':
		m := map[string]any{}
		d.object(func(k string) { m[k] = d.value(depth + 1) })
		return m
	case c == '[':
		d.i++
		a := []any{}
		if d.peek() == ']' {
			d.i++
			return a
		}
		for d.err == nil {
			a = append(a, d.value(depth+1))
			switch d.peek() {
			case ',':
				d.i++
			case ']':
				d.i++
				return a
			default:
				d.fail("expected , or ] in array")
			}
		}
		return nil
	case c == '"':
		return d.str()
	case c == 't' || c == 'f':
		return d.boolean()
	case c == 'n':
		d.literal("null")
		return nil
	case c == '-' || ('0' <= c && c <= '9'):
		return d.float()
	}
	d.fail("unexpected character")
	return nil
}

func (d *decoder) skip() { d.value(0) }

func decodeInput(b []byte) (Input, error) {
	in := Input{Raw: b}
	d := &decoder{b: b}
	d.object(func(k string) {
		switch k {
		case "point":
			in.Point = d.str()
		case "project_id":
			in.ProjectID = d.optStr()
		case "at_ms":
			in.AtMs = d.int64()
		case "request":
			d.request(&in.Request)
		case "plan":
			d.object(func(k string) {
				switch k {
				case "concurrency":
					in.Plan.Concurrency = d.int()
				case "rate_per_sec":
					in.Plan.RatePerSec = d.int()
				default:
					d.skip()
				}
			})
		case "active_sessions":
			in.ActiveSessions = d.int64()
		case "session":
			d.session(&in.Session)
		case "event":
			d.event(&in.Event)
		case "spend":
			d.spend(&in.Spend)
		default:
			d.skip()
		}
	})
	if d.err == nil {
		if d.ws(); d.i != len(d.b) {
			d.fail("trailing data")
		}
	}
	return in, d.err
}

func (d *decoder) request(r *Request) {
	d.object(func(k string) {
		switch k {
		case "tier":
			r.Tier = d.intPtr()
		case "template":
			r.Template = d.optStr()
		case "region":
			r.Region = d.optStr()
		case "resources":
			if d.null() {
				return
			}
			r.Resources = &ResourceRequest{}
			d.object(func(k string) {
				switch k {
				case "size_class":
					r.Resources.SizeClass = d.optStr()
				case "vcpu":
					r.Resources.VCPU = d.intPtr()
				case "memory_mib":
					r.Resources.MemoryMiB = d.intPtr()
				case "disk_gib":
					r.Resources.DiskGiB = d.intPtr()
				default:
					d.skip()
				}
			})
		case "idle_timeout_s":
			r.IdleTimeoutS = d.intPtr()
		case "max_lifetime_s":
			r.MaxLifetimeS = d.intPtr()
		case "end_user_id":
			r.EndUserID = d.optStr()
		case "policy_id":
			r.PolicyID = d.optStr()
		case "volume_id":
			r.VolumeID = d.optStr()
		case "restore_from":
			r.RestoreFrom = d.optStr()
		case "metadata":
			r.Metadata = d.strMap()
		default:
			d.skip()
		}
	})
}

func (d *decoder) session(s *Session) {
	d.object(func(k string) {
		switch k {
		case "id":
			s.ID = d.optStr()
		case "state":
			s.State = d.optStr()
		case "tier":
			s.Tier = d.int()
		case "template":
			s.Template = d.optStr()
		case "region":
			s.Region = d.optStr()
		case "end_user_id":
			s.EndUserID = d.optStr()
		case "metadata":
			s.Metadata = d.strMap()
		case "resources":
			d.object(func(k string) {
				switch k {
				case "vcpu":
					s.Resources.VCPU = d.int()
				case "memory_mib":
					s.Resources.MemoryMiB = d.int()
				case "disk_gib":
					s.Resources.DiskGiB = d.int()
				case "size_class":
					s.Resources.SizeClass = d.optStr()
				default:
					d.skip()
				}
			})
		case "usage_to_date":
			d.object(func(k string) {
				switch k {
				case "session_s":
					s.Usage.SessionS = d.int64()
				case "cpu_ms":
					s.Usage.CPUMs = d.int64()
				case "mem_gib_ms":
					s.Usage.MemGiBMs = d.int64()
				case "egress_bytes":
					s.Usage.EgressBytes = d.int64()
				default:
					d.skip()
				}
			})
		default:
			d.skip()
		}
	})
}

func (d *decoder) event(e *Event) {
	d.object(func(k string) {
		switch k {
		case "type":
			e.Type = d.optStr()
		case "at_ms":
			e.AtMs = d.int64()
		case "data":
			if m, ok := d.value(0).(map[string]any); ok {
				e.Data = m
			}
		default:
			d.skip()
		}
	})
}

func (d *decoder) spend(s *Spend) {
	d.object(func(k string) {
		switch k {
		case "scope":
			s.Scope = d.optStr()
		case "end_user_id":
			s.EndUserID = d.optStr()
		case "level":
			s.Level = d.optStr()
		case "spend_micro_usd":
			s.SpendMicroUSD = d.int64()
		case "cap_micro_usd":
			s.CapMicroUSD = d.int64()
		case "month":
			s.Month = d.optStr()
		default:
			d.skip()
		}
	})
}
