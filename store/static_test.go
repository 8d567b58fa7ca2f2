package store

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestStaticAppendJSON: static.appendJSON writes what json.Marshal does, byte for byte: with
// no field set (the omitempty ones left out), with every field set (a field added to static
// is set too, by reflection, and one that appendJSON does not write differs), with each of the
// strings that need an escape, and with an empty map.
func TestStaticAppendJSON(t *testing.T) {
	awkward := []string{"plain", `a " quote`, `a \ backslash`, "a<b", "a>b", "a&b", "ctl\t\n\x00\x1f",
		"é 日本 🎉", "line\u2028para\u2029", "bad \xff utf-8", "https://x.test/v1/sessions/s/exec?a=1&b=2"}
	check := func(name string, d *static) {
		t.Helper()
		want, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := d.appendJSON([]byte("prefix")); string(got) != "prefix"+string(want) {
			t.Errorf("%s: appendJSON\n%s\njson.Marshal\n%s", name, got[len("prefix"):], want)
		}
	}
	check("zero", &static{})
	for i := range awkward {
		n := 0
		next := func() string { n++; return awkward[(i+n)%len(awkward)] }
		var d static
		var fill func(v reflect.Value)
		fill = func(v reflect.Value) {
			switch v.Kind() {
			case reflect.String:
				v.SetString(next())
			case reflect.Int:
				v.SetInt(int64(-7 + 1000*n))
				n++
			case reflect.Pointer:
				v.Set(reflect.New(v.Type().Elem()))
				fill(v.Elem())
			case reflect.Map:
				m := map[string]string{}
				for range 4 {
					m[next()+next()] = next()
				}
				v.Set(reflect.ValueOf(m))
			case reflect.Struct:
				for f := range v.NumField() {
					fill(v.Field(f))
				}
			default:
				t.Fatalf("a field of kind %s (%s): teach static.appendJSON and this test about it", v.Kind(), v.Type())
			}
		}
		fill(reflect.ValueOf(&d).Elem())
		check("all set", &d)
		d.Metadata = map[string]string{}
		d.EndUserID, d.PolicyID = nil, nil
		check("empty metadata, some unset", &d)
	}
}
