package mergepatch

// Apply answers target patched by patch (RFC 7386, section 2): when patch is an object, each
// of its keys set to null is removed from target, each set to an object is merged into
// target's value recursively (a target value that is not an object is first replaced by an
// empty one), and each set to anything else replaces target's value; a patch that is not an
// object replaces the whole target. Neither argument is modified, and the answer shares no
// object or array with either.
func Apply(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return copyValue(patch)
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = nil
	}
	out := make(map[string]any, len(t)+len(p))
	for k, v := range t {
		out[k] = copyValue(v)
	}
	for k, v := range p {
		switch v := v.(type) {
		case nil:
			delete(out, k)
		case map[string]any:
			out[k] = Apply(out[k], v)
		default:
			out[k] = copyValue(v)
		}
	}
	return out
}

// Compose answers one patch whose effect is applying a, then b:
//
//	Apply(Apply(x, a), b) == Apply(x, Compose(a, b))   for every document x
//
// except in the one case a single merge patch cannot express (see Inexact): a sets a key to a
// value that is not an object (null, a string, a number, a boolean, an array) and b then sets
// the same key to an object. Applied one after the other, b's object replaces whatever x held
// there; a merge patch can only merge an object into x's value, so Compose answers b's object
// and, where x holds an object at that key, its other keys survive. Nulls of both patches are
// kept: they still remove. Neither argument is modified.
func Compose(a, b any) any {
	bm, ok := b.(map[string]any)
	if !ok {
		return copyValue(b) // a patch that is not an object replaces the document: a no longer matters
	}
	am, ok := a.(map[string]any)
	if !ok {
		am = nil
	}
	out := make(map[string]any, len(am)+len(bm))
	for k, v := range am {
		out[k] = copyValue(v)
	}
	for k, v := range bm {
		if vm, ok := v.(map[string]any); ok {
			out[k] = Compose(out[k], vm)
			continue
		}
		out[k] = copyValue(v)
	}
	return out
}

// Inexact answers the path of keys to the first place where Compose(a, b) is not exactly a
// then b (a non-object in a, an object in b), and false when Compose is exact. A top-level
// non-object a followed by an object b answers an empty path and true.
func Inexact(a, b any) ([]string, bool) {
	bm, ok := b.(map[string]any)
	if !ok {
		return nil, false
	}
	am, ok := a.(map[string]any)
	if !ok {
		return []string{}, true
	}
	for k, bv := range bm {
		if _, ok := bv.(map[string]any); !ok {
			continue
		}
		av, present := am[k]
		if !present {
			continue // nothing of a there: b's object merges as it would have
		}
		if path, bad := Inexact(av, bv); bad {
			return append([]string{k}, path...), true
		}
	}
	return nil, false
}

// copyValue deep-copies objects and arrays so that an answer never aliases an argument.
func copyValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = copyValue(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = copyValue(e)
		}
		return out
	default:
		return v
	}
}
