package policies

import (
	"strconv"
	"strings"
)

// maskValue is what a masked field reads as in the decision log.
const maskValue = "***"

// mask replaces, in the JSON value v (maps, slices, scalars, as ast.JSON answers them), the
// value at each dotted path with "***". A segment "*" matches every key of an object or
// every element of an array. Paths that do not exist are ignored. v is modified in place.
func mask(v any, paths []string) {
	for _, p := range paths {
		maskPath(v, strings.Split(p, "."))
	}
}

func maskPath(v any, segs []string) {
	if len(segs) == 0 {
		return
	}
	seg, last := segs[0], len(segs) == 1
	switch x := v.(type) {
	case map[string]any:
		if seg == "*" {
			for k := range x {
				maskAt(x, k, segs)
			}
			return
		}
		if _, ok := x[seg]; ok {
			maskAt(x, seg, segs)
		}
	case []any:
		for i := range x {
			if seg == "*" || seg == strconv.Itoa(i) {
				if last {
					x[i] = maskValue
				} else {
					maskPath(x[i], segs[1:])
				}
			}
		}
	}
}

func maskAt(m map[string]any, k string, segs []string) {
	if len(segs) == 1 {
		m[k] = maskValue
		return
	}
	maskPath(m[k], segs[1:])
}
