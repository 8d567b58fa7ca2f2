package policies

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// maskValue is what a masked field reads as in the decision log.
const maskValue = "***"

// maskedJSON encodes an input value as JSON (object keys sorted, sets as arrays) with the
// value at each dotted path replaced by "***". A path segment "*" matches every key of an
// object or every element of an array; paths that do not exist are ignored. It reads the
// value without copying or changing it.
func maskedJSON(v ast.Value, paths []string) []byte {
	masks := make([][]string, 0, len(paths))
	for _, p := range paths {
		masks = append(masks, strings.Split(p, "."))
	}
	return appendJSON(make([]byte, 0, 512), v, masks)
}

// step answers the masks that apply below key, and whether key itself is masked.
func step(masks [][]string, key string) ([][]string, bool) {
	var next [][]string
	for _, m := range masks {
		if m[0] != key && m[0] != "*" {
			continue
		}
		if len(m) == 1 {
			return nil, true
		}
		next = append(next, m[1:])
	}
	return next, false
}

func appendJSON(b []byte, v ast.Value, masks [][]string) []byte {
	switch x := v.(type) {
	case ast.Null:
		return append(b, "null"...)
	case ast.Boolean:
		return strconv.AppendBool(b, bool(x))
	case ast.Number:
		return append(b, x...)
	case ast.String:
		return appendString(b, string(x))
	case *ast.Array:
		b = append(b, '[')
		for i := range x.Len() {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendElem(b, x.Elem(i).Value, masks, strconv.Itoa(i))
		}
		return append(b, ']')
	case ast.Set:
		return appendJSON(b, x.Sorted(), masks)
	case ast.Object:
		b = append(b, '{')
		first := true
		x.Foreach(func(k, val *ast.Term) {
			if !first {
				b = append(b, ',')
			}
			first = false
			key, ok := k.Value.(ast.String)
			ks := string(key)
			if !ok {
				ks = k.Value.String()
			}
			b = appendString(b, ks)
			b = append(b, ':')
			b = appendElem(b, val.Value, masks, ks)
		})
		return append(b, '}')
	default:
		return appendString(b, v.String())
	}
}

func appendElem(b []byte, v ast.Value, masks [][]string, key string) []byte {
	if len(masks) == 0 {
		return appendJSON(b, v, nil)
	}
	next, masked := step(masks, key)
	if masked {
		return appendString(b, maskValue)
	}
	return appendJSON(b, v, next)
}

// appendString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
