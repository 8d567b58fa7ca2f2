//go:build !wasip1

package sdk

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeInput(t *testing.T) {
	raw := `{"point":"admission","project_id":"p1","at_ms":1700000000000,
	 "request":{"tier":3,"template":"py\u00e9\ud83d\ude00","region":null,"resources":{"size_class":"m","vcpu":2,"memory_mib":null},
	  "idle_timeout_s":60,"end_user_id":"free_1","metadata":{"team":"a\"b","x":null},"unknown":{"deep":[1,2,{"a":[]}]}},
	 "plan":{"concurrency":5,"rate_per_sec":2,"new":true},"active_sessions":4,"extra":[1e3,-2.5,"s",false,null]}`
	in, err := decodeInput([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	r := &in.Request
	if in.Point != PointAdmission || in.ProjectID != "p1" || in.AtMs != 1700000000000 || in.ActiveSessions != 4 ||
		in.Plan != (Plan{5, 2}) || *r.Tier != 3 || r.Template != "pyé😀" || r.Region != "" ||
		r.Resources.SizeClass != "m" || *r.Resources.VCPU != 2 || r.Resources.MemoryMiB != nil || *r.IdleTimeoutS != 60 ||
		r.MaxLifetimeS != nil || r.EndUserID != "free_1" || !reflect.DeepEqual(r.Metadata, map[string]string{"team": `a"b`, "x": ""}) {
		t.Fatalf("decoded %+v request %+v", in, r)
	}

	raw = `{"point":"runtime","project_id":"p","session":{"id":"ses_1","tier":2,"end_user_id":null,"state":"running",
	 "resources":{"vcpu":1,"memory_mib":512,"disk_gib":1,"size_class":"s"},"usage_to_date":{"cpu_ms":10,"egress_bytes":2e3}},
	 "event":{"type":"egress","at_ms":5,"data":{"host":"x.com","port":443,"tags":["a",1.5,null,true]}}}`
	in, err = decodeInput([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{}
	if err := json.Unmarshal([]byte(`{"host":"x.com","port":443,"tags":["a",1.5,null,true]}`), &want); err != nil {
		t.Fatal(err)
	}
	if in.Session.ID != "ses_1" || in.Session.Tier != 2 || in.Session.Resources.MemoryMiB != 512 || in.Session.Usage.EgressBytes != 2000 ||
		in.Event.Type != "egress" || in.Event.AtMs != 5 || !reflect.DeepEqual(in.Event.Data, want) {
		t.Fatalf("decoded %+v %+v %+v", in, in.Session, in.Event)
	}

	// Keys escaped, near the end of the input, longer than 16 bytes, or prefixes of known keys.
	in, err = decodeInput([]byte(`{"activ":1,"active_sessions_x":9,"po\u0069nt":"spend","active_sessions":7,"at_ms":3}`))
	if err != nil || in.Point != "spend" || in.ActiveSessions != 7 || in.AtMs != 3 {
		t.Fatalf("%+v %v", in, err)
	}

	for _, bad := range []string{``, `{`, `{"point":}`, `{"point":"a",}`, `{"point":"a"} x`, `{"request":{"tier":1.5}}`,
		`{"point":"\x01"}`, `{"point":"\q"}`, `[` + strings.Repeat("[", 100) + `]`, `{"a":tru}`, `{"a":"\u12"}`} {
		if _, err := decodeInput([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestEncodeDecision(t *testing.T) {
	d := Deny("no \"gpu\"\n\x01<é>", "second").Warn("w").WithPatch("tier", 1).WithPatch("metadata", map[string]string{"b": "2", "a": "1"}).
		WithPatch("x", map[string]any{"f": 1.5, "n": nil, "l": []any{true, int64(-3), uint8(2), "s"}, "big": 1e300, "nan": math.NaN()})
	b := appendDecision(nil, d)
	var got struct {
		Allow    bool           `json:"allow"`
		Reasons  []string       `json:"reasons"`
		Warnings []string       `json:"warnings"`
		Patch    map[string]any `json:"patch"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	wantPatch := map[string]any{"tier": 1.0, "metadata": map[string]any{"a": "1", "b": "2"},
		"x": map[string]any{"f": 1.5, "n": nil, "l": []any{true, -3.0, 2.0, "s"}, "big": 1e300, "nan": nil}}
	if got.Allow || !reflect.DeepEqual(got.Reasons, d.Reasons) || !reflect.DeepEqual(got.Warnings, []string{"w"}) || !reflect.DeepEqual(got.Patch, wantPatch) {
		t.Fatalf("got %+v from %s", got, b)
	}
	if s := string(appendDecision(nil, Allow())); s != `{"allow":true}` {
		t.Fatal(s)
	}
	if s := string(appendString(nil, "a\xffb")); s != `"a\ufffdb"` {
		t.Fatal(s)
	}
}

func TestInvoke(t *testing.T) {
	Handle(func(in Input) Decision {
		if v, _ := Config("deny"); v == in.Request.Template {
			return Deny("template " + in.Request.Template)
		}
		return Allow()
	})
	defer Handle(nil)
	SetTestConfig(map[string]string{"deny": "gpu"})
	out, err := Invoke([]byte(`{"point":"admission","request":{"template":"gpu"}}`))
	if err != nil || string(out) != `{"allow":false,"reasons":["template gpu"]}` {
		t.Fatalf("%s %v", out, err)
	}
	if _, err := Invoke([]byte(`{`)); err == nil || !strings.Contains(err.Error(), "invalid input") {
		t.Fatal(err)
	}
}

func TestStringScan(t *testing.T) {
	// Every position of every special byte, around the 8-byte steps.
	for n := range 20 {
		for pos := range n {
			for _, c := range []byte{'"', '\\', 0x01, 0x1f} {
				b := []byte(strings.Repeat("é", n))[:n]
				b[pos] = c
				raw, _ := json.Marshal(string(b))
				var want string
				if err := json.Unmarshal(raw, &want); err != nil {
					t.Fatal(err)
				}
				d := &decoder{b: append(raw, ` `...)}
				if got := d.str(); got != want || d.err != nil {
					t.Fatalf("%q: got %q %v, want %q", raw, got, d.err, want)
				}
			}
		}
	}
	d := &decoder{b: []byte(`"abc` + "\x01" + `defghijk"`)}
	if d.str(); d.err == nil {
		t.Fatal("raw control character accepted")
	}
}
