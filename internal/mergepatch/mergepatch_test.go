package mergepatch

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

func decode(t testing.TB, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

func encode(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// rfc7386 is every example of RFC 7386, Appendix A: original, patch, result.
var rfc7386 = []struct{ target, patch, want string }{
	{`{"a":"b"}`, `{"a":"c"}`, `{"a":"c"}`},
	{`{"a":"b"}`, `{"b":"c"}`, `{"a":"b","b":"c"}`},
	{`{"a":"b"}`, `{"a":null}`, `{}`},
	{`{"a":"b","b":"c"}`, `{"a":null}`, `{"b":"c"}`},
	{`{"a":["b"]}`, `{"a":"c"}`, `{"a":"c"}`},
	{`{"a":"c"}`, `{"a":["b"]}`, `{"a":["b"]}`},
	{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`, `{"a":{"b":"d"}}`},
	{`{"a":[{"b":"c"}]}`, `{"a":[1]}`, `{"a":[1]}`},
	{`["a","b"]`, `["c","d"]`, `["c","d"]`},
	{`{"a":"b"}`, `["c"]`, `["c"]`},
	{`{"a":"foo"}`, `null`, `null`},
	{`{"a":"foo"}`, `"bar"`, `"bar"`},
	{`{"e":null}`, `{"a":1}`, `{"e":null,"a":1}`},
	{`[1,2]`, `{"a":"b","c":null}`, `{"a":"b"}`},
	{`{}`, `{"a":{"bb":{"ccc":null}}}`, `{"a":{"bb":{}}}`},
}

func TestApplyRFC7386(t *testing.T) {
	for _, c := range rfc7386 {
		target, patch := decode(t, c.target), decode(t, c.patch)
		got := Apply(target, patch)
		if want := decode(t, c.want); !reflect.DeepEqual(got, want) {
			t.Errorf("Apply(%s, %s) = %s, want %s", c.target, c.patch, encode(got), c.want)
		}
		// Neither argument changes.
		if encode(target) != encode(decode(t, c.target)) || encode(patch) != encode(decode(t, c.patch)) {
			t.Errorf("Apply(%s, %s) modified an argument: %s, %s", c.target, c.patch, encode(target), encode(patch))
		}
	}
}

// Composing with the empty patch changes nothing, and a composed patch keeps the nulls of
// both sides: a null removes the field whoever wrote it.
func TestComposeKeepsNulls(t *testing.T) {
	for _, c := range []struct{ a, b, want string }{
		{`{}`, `{"end_user_id":null,"metadata":{"secret":null}}`, `{"end_user_id":null,"metadata":{"secret":null}}`},
		{`{"end_user_id":null,"metadata":{"secret":null}}`, `{}`, `{"end_user_id":null,"metadata":{"secret":null}}`},
		{`{"metadata":{"a":"1"}}`, `{"metadata":{"secret":null}}`, `{"metadata":{"a":"1","secret":null}}`},
		{`{"idle_timeout_s":60}`, `{"idle_timeout_s":null}`, `{"idle_timeout_s":null}`},
		{`{"idle_timeout_s":null}`, `{"idle_timeout_s":60}`, `{"idle_timeout_s":60}`},
		{`{"metadata":{"a":"1"}}`, `{"metadata":null}`, `{"metadata":null}`},
		{`{"a":{"b":"c"}}`, `["x"]`, `["x"]`},
	} {
		a, b := decode(t, c.a), decode(t, c.b)
		got := Compose(a, b)
		if want := decode(t, c.want); !reflect.DeepEqual(got, want) {
			t.Errorf("Compose(%s, %s) = %s, want %s", c.a, c.b, encode(got), c.want)
		}
		if encode(a) != encode(decode(t, c.a)) || encode(b) != encode(decode(t, c.b)) {
			t.Errorf("Compose(%s, %s) modified an argument", c.a, c.b)
		}
	}
	// The request of the issue: on {"end_user_id":"u","metadata":{"secret":"s","k":"v"}},
	// the composed patch removes both fields, as the patch alone does.
	x := decode(t, `{"end_user_id":"u","metadata":{"secret":"s","k":"v"}}`)
	p := decode(t, `{"end_user_id":null,"metadata":{"secret":null}}`)
	if got := encode(Apply(x, Compose(map[string]any{}, p))); got != `{"metadata":{"k":"v"}}` {
		t.Fatalf("composed patch gave %s", got)
	}
}

// The one case a single patch cannot express: a non-object, then an object, for one key.
func TestInexact(t *testing.T) {
	for _, c := range []struct {
		a, b string
		path string // "" with exact
		bad  bool
	}{
		{`{"metadata":null}`, `{"metadata":{"a":"1"}}`, `["metadata"]`, true},
		{`{"resources":"x"}`, `{"resources":{"vcpu":2}}`, `["resources"]`, true},
		{`{"a":{"b":[1]}}`, `{"a":{"b":{"c":1}}}`, `["a","b"]`, true},
		{`"x"`, `{"a":1}`, `[]`, true},
		{`{"metadata":{"a":null}}`, `{"metadata":{"a":"1"}}`, ``, false},
		{`{"metadata":{"a":"1"}}`, `{"metadata":null}`, ``, false},
		{`{}`, `{"metadata":{"a":"1"}}`, ``, false},
		{`{"tier":1}`, `{"metadata":{"a":"1"}}`, ``, false},
		{`{"a":null}`, `["x"]`, ``, false},
	} {
		path, bad := Inexact(decode(t, c.a), decode(t, c.b))
		if bad != c.bad || (bad && encode(path) != c.path) {
			t.Errorf("Inexact(%s, %s) = %v %v, want %s %v", c.a, c.b, encode(path), bad, c.path, c.bad)
		}
	}
	// Where it is inexact, the difference shows on a document holding an object there.
	x := decode(t, `{"metadata":{"secret":"s"}}`)
	a, b := decode(t, `{"metadata":null}`), decode(t, `{"metadata":{"a":"1"}}`)
	if seq, one := encode(Apply(Apply(x, a), b)), encode(Apply(x, Compose(a, b))); seq != `{"metadata":{"a":"1"}}` || one != `{"metadata":{"a":"1","secret":"s"}}` {
		t.Fatalf("sequential %s, composed %s", seq, one)
	}
}

// randomValue draws a small JSON value from a few keys, so that patches collide often.
func randomValue(r *rand.Rand, depth int) any {
	n := r.IntN(10)
	if depth <= 0 && n >= 6 {
		n = r.IntN(6)
	}
	switch n {
	case 0, 1:
		return nil
	case 2:
		return float64(r.IntN(3))
	case 3:
		return []string{"x", "y"}[r.IntN(2)]
	case 4:
		return r.IntN(2) == 0
	case 5:
		return []any{float64(r.IntN(2))}
	default:
		m := map[string]any{}
		for range r.IntN(4) {
			m[[]string{"a", "b", "c"}[r.IntN(3)]] = randomValue(r, depth-1)
		}
		return m
	}
}

// checkCompose: applying Compose(a, b) is applying a then b, wherever Inexact says it is exact.
func checkCompose(t *testing.T, x, a, b any) {
	t.Helper()
	if _, bad := Inexact(a, b); bad {
		return
	}
	seq, one := Apply(Apply(x, a), b), Apply(x, Compose(a, b))
	if !reflect.DeepEqual(seq, one) {
		t.Fatalf("x=%s a=%s b=%s: a then b gives %s, Compose(a, b)=%s gives %s",
			encode(x), encode(a), encode(b), encode(seq), encode(Compose(a, b)), encode(one))
	}
}

func TestComposeMatchesSequentialApply(t *testing.T) {
	r := rand.New(rand.NewPCG(7386, 1))
	exact := 0
	for range 20000 {
		x, a, b := randomValue(r, 3), randomValue(r, 3), randomValue(r, 3)
		if _, bad := Inexact(a, b); !bad {
			exact++
		}
		checkCompose(t, x, a, b)
	}
	if exact < 10000 {
		t.Fatalf("only %d of 20000 random pairs were composable: the generator tests too little", exact)
	}
}

func FuzzCompose(f *testing.F) {
	for _, c := range rfc7386 {
		f.Add(c.target, c.patch, c.want)
	}
	f.Add(`{"end_user_id":"u","metadata":{"secret":"s"}}`, `{"metadata":{"a":"1"}}`, `{"end_user_id":null,"metadata":{"secret":null}}`)
	f.Fuzz(func(t *testing.T, xs, as, bs string) {
		var x, a, b any
		if json.Unmarshal([]byte(xs), &x) != nil || json.Unmarshal([]byte(as), &a) != nil || json.Unmarshal([]byte(bs), &b) != nil {
			return
		}
		checkCompose(t, x, a, b)
	})
}
