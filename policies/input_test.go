package policies

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"wb/session"
)

// fill sets every field reachable from v to a distinct non-zero value.
func fill(t *testing.T, v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)))
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(*n))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n)
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), n)
		}
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(t, k, n)
			fill(t, e, n)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		t.Fatalf("fill: a %s field: teach admissionValue and this test about it", v.Kind())
	}
}

func TestAdmissionValue(t *testing.T) {
	var full session.AdmissionInput
	n := 0
	fill(t, reflect.ValueOf(&full).Elem(), &n)
	vcpu := 2
	for name, in := range map[string]session.AdmissionInput{
		"full":              full,
		"zero":              {},
		"typical":           admission("proj_x", 2, map[string]string{"plan": "pro"}),
		"partial resources": {Request: session.CreateRequest{Resources: &session.ResourceRequest{VCPU: &vcpu}}},
		"empty metadata":    {Request: session.CreateRequest{Metadata: map[string]string{}}},
	} {
		raw, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ast.ValueFromReader(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		if got := admissionValue(in); got.Compare(want) != 0 {
			t.Errorf("%s:\n got %v\nwant %v", name, got, want)
		}
	}
}
