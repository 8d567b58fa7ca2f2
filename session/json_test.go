package session

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// awkward are strings whose JSON needs each of json.Marshal's escapes.
var awkward = []string{"", "plain", `a " quote`, `a \ backslash`, "a<b", "a>b", "a&b", "tab\tnl\ncr\rbs\bff\f\x00\x1f",
	"é 日本 🎉", "line\u2028para\u2029", "bad \xff\xfe utf-8", "\x7f del", "https://x.test/v1/sessions/s/exec?a=1&b=2"}

// fillAll sets every field that v holds (recursively, through pointers) to a value that is
// not its zero, taking strings from strs in turn: a field added to Session is then set, and
// one that AppendJSON does not write differs from json.Marshal's.
func fillAll(t *testing.T, v reflect.Value, strs *[]string, n *int64) {
	t.Helper()
	next := func() string {
		s := (*strs)[0]
		*strs = append((*strs)[1:], s)
		return s
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(next())
	case reflect.Int, reflect.Int64:
		*n = -*n*3 + 7
		v.SetInt(*n)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillAll(t, v.Elem(), strs, n)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 5 {
			m.SetMapIndex(reflect.ValueOf(next()+next()), reflect.ValueOf(next()))
		}
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			*n++
			v.Set(reflect.ValueOf(time.Date(2026, 12, 6, 15, 4, 5, int(*n%1000)*1e6, time.FixedZone("x", 3600))))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillAll(t, v.Field(i), strs, n)
			}
		}
	default:
		t.Fatalf("fillAll: a field of kind %s (%s): teach AppendJSON and this test about it", v.Kind(), v.Type())
	}
}

// TestSessionAppendJSON: AppendJSON writes what json.Marshal does, byte for byte: with no field
// set, with every field set (fillAll, with each of the strings that need an escape in turn),
// with a false cold start, an empty map, and after what a buffer held.
func TestSessionAppendJSON(t *testing.T) {
	check := func(name string, s *Session) {
		t.Helper()
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("%s: AppendJSON\n%s\njson.Marshal\n%s", name, got, want)
		}
		if got := s.AppendJSON([]byte("prefix")); string(got) != "prefix"+string(want) {
			t.Errorf("%s: AppendJSON after a prefix: %s", name, got)
		}
	}
	check("zero", &Session{})
	for i := range awkward {
		strs := append(append([]string(nil), awkward[i:]...), awkward[:i]...)
		var s Session
		n := int64(i)
		fillAll(t, reflect.ValueOf(&s).Elem(), &strs, &n)
		check("all set", &s)
		f := false
		s.ColdStart = &f
		s.Metadata = map[string]string{}
		check("cold start false, empty metadata", &s)
	}
	now := At(time.Now())
	check("a create's", &Session{ID: "sess_01", Object: ObjectName, Tier: 2, State: Pending, ProjectID: "proj_1",
		Template: "tpl_base@sha256:aaaa", Region: "local", Resources: Resources{VCPU: 2, MemoryMiB: 2048, DiskGiB: 10, SizeClass: "m"},
		IdleTimeoutS: 120, MaxLifetimeS: 3600, CreatedAt: *now, Connect: Connect{ExecURL: "http://h/v1/sessions/sess_01/exec?connect_token=v1.a.b"}})
}

// FuzzSessionAppendJSON: AppendJSON writes what json.Marshal does for any strings.
func FuzzSessionAppendJSON(f *testing.F) {
	for _, s := range awkward {
		f.Add(s, s+"k", int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, a, b string, ms int64) {
		s := &Session{ID: a, State: State(b), EndUserID: &b, StateReason: (*Reason)(&a), Metadata: map[string]string{a: b, b: a, "k": a + b},
			Connect: Connect{ExecURL: a + b}, CreatedAt: Time{time.UnixMilli(ms)}, StartedAt: &Time{time.UnixMilli(-ms)}}
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("AppendJSON\n%q\njson.Marshal\n%q", got, want)
		}
	})
}

// BenchmarkSessionJSON: a create's answer (its connect URLs with their tokens) by json.Marshal
// and by AppendJSON.
func BenchmarkSessionJSON(b *testing.B) {
	eu := "eu_bench"
	tok := "?connect_token=v1.eyJzIjoic2Vzc18wMUpFWkFCQ0RFRkdISktNTlBRUlNUVldYWVoiLCJwIjoicHJval8wMSIsImUiOjE3NjUwMzQ2NDV9.c2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXJlc2lnbmF0dXI"
	s := &Session{ID: "sess_01JEZABCDEFGHJKMNPQRSTVWXYZ", Object: ObjectName, Tier: 2, State: Pending, ProjectID: "proj_01JEZABCDEFGHJKMNPQRSTVWXY",
		EndUserID: &eu, Template: "tpl_base@sha256:aaaa", Region: "local", Resources: Resources{VCPU: 2, MemoryMiB: 2048, DiskGiB: 10, SizeClass: "m"},
		IdleTimeoutS: 120, MaxLifetimeS: 3600, CreatedAt: *At(time.Now()),
		Connect: Connect{ExecURL: "http://127.0.0.1:8080/v1/sessions/sess_01JEZABCDEFGHJKMNPQRSTVWXYZ/exec" + tok,
			PTYURL: "ws://127.0.0.1:8080/v1/sessions/sess_01JEZABCDEFGHJKMNPQRSTVWXYZ/pty" + tok}}
	b.Run("Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(s); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.AppendJSON(make([]byte, 0, 1536))
		}
	})
}
