package policies

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestBoundedBuiltinsWork: within their bounds the bounded builtins answer as OPA's do, under
// their own names, template strings included.
func TestBoundedBuiltinsWork(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	src := `package wb.admission

deny contains sprintf("%5d|%-4s|%v", [42, "ab", [1, 2]])

deny contains concat("-", ["a", "b", "c"])

deny contains replace("aXbX", "X", "y")

deny contains strings.replace_n({"a": "1", "b": "2"}, "abc")

deny contains regex.replace("a1b22", "[0-9]+", "#")

deny contains json.marshal(json.unmarshal("{\"k\":[1,2.5,\"x\"]}"))

deny contains format_int(count(numbers.range(1, 1000)) * 1000000007, 10)

deny contains concat(",", split("x,y", ","))

deny contains $"tier {input.request.tier} of {count(array.concat([1], [2, 3]))}"

deny contains upper(base64.decode(base64.encode("ok")))

deny contains "gql" if graphql.is_valid("{ a b: a }", "type Query { a: Int }")

deny contains "subset" if object.subset({"a": [1, 2, 3], "b": 1}, {"a": [2, 3]})

deny contains msg if {
	s := {1, 2} | {3}
	msg := sprintf("%d %d", [count(s), count(union({{1}, {2, 3}}))])
}
`
	if _, err := e.Put(ctx, "proj_bw", "ok", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission("proj_bw", 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"   42|ab  |[1, 2]", "a-b-c", "ayby", "12c", "a#b#", `{"k":[1,2.5,"x"]}`, "1000000007000",
		"x,y", "tier 2 of 3", "OK", "3 3", "gql", "subset"}
	for _, w := range want {
		if !slices.Contains(d.Reasons, "pol_ok@1: "+w) {
			t.Errorf("no reason %q in %q", w, d.Reasons)
		}
	}

	// Errors name the builtins as the author wrote them.
	_, err = e.Put(ctx, "proj_bw", "bad", "package wb.admission\n\ndeny contains sprintf(1, 2)\n", ModeEnforce)
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "sprintf") || strings.Contains(err.Error(), boundedPrefix) {
		t.Errorf("type error: %v", err)
	}
	_, err = e.Put(ctx, "proj_bw", "bad", "package wb.admission\n\ndeny contains x if x := opa.runtime().env.HOME\n", ModeEnforce)
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "opa.runtime is not available to policies") {
		t.Errorf("forbidden builtin: %v", err)
	}
	// A rule named like a builtin stays the policy's own.
	if _, err := e.Put(ctx, "proj_bw2", "own", "package wb.admission\n\nlower := \"mine\"\n\ndeny contains lower\n", ModeEnforce); err != nil {
		t.Fatal(err)
	}
	if d, err := e.Admit(ctx, admission("proj_bw2", 2, nil)); err != nil || !slices.Equal(d.Reasons, []string{"pol_own@1: mine"}) {
		t.Errorf("a rule named lower: %+v %v", d, err)
	}
	// An evaluation's error names the builtin as written, and errors.Is finds the budget.
	if _, err := e.Put(ctx, "proj_bw3", "big", "package wb.admission\n\ndeny contains \"x\" if count(numbers.range(1, 100000000)) > 0\n", ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err = e.Admit(ctx, admission("proj_bw3", 2, nil))
	if err != nil || d.Allow || len(d.Reasons) != 1 || !strings.Contains(d.Reasons[0], "numbers.range: policy evaluation exceeded its memory budget: the call would make") || strings.Contains(d.Reasons[0], boundedPrefix) {
		t.Errorf("over budget: %+v %v", d, err)
	}
}

func TestSaneNumber(t *testing.T) {
	for n, want := range map[string]bool{
		"1": true, "-12.5": true, "1e300": true, "1e999": true, "1e1000": false, "1e999999999": false,
		"1e-5": true, "1e-99999999": false, strings.Repeat("9", 1000): true, strings.Repeat("9", 1003): false,
		"1E+10": true, "1ex": false,
	} {
		if got := saneNumber(ast.Number(n)); got != want {
			t.Errorf("saneNumber(%.20s) = %v, want %v", n, got, want)
		}
	}
}

// TestMessagesBounded: a policy's deny says at most 64 messages of at most 1 KiB each.
func TestMessagesBounded(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second}) // a cold machine under -race is slow
	src := "package wb.admission\n\nxs := concat(\"\", [\"x\" | some _ in numbers.range(1, 2000)])\n\ndeny contains sprintf(\"%d %s\", [i, xs]) if some i in numbers.range(1, 1000)\n"
	if _, err := e.Put(ctx, "proj_msgs", "many", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission("proj_msgs", 2, nil))
	if err != nil || d.Allow {
		t.Fatalf("%v %v", d.Allow, err)
	}
	if len(d.Reasons) != maxMessages+1 || !strings.HasSuffix(d.Reasons[maxMessages], "… and 936 more") {
		t.Errorf("%d reasons, last %q", len(d.Reasons), d.Reasons[len(d.Reasons)-1])
	}
	for _, r := range d.Reasons {
		if len(r) > maxMessageBytes+64 {
			t.Errorf("a reason of %d bytes", len(r))
		}
	}
}

// TestKeyBuiltinsWork: the key and certificate builtins, bounded in work, load a 4096-bit RSA
// key and its certificate, sign with the key and verify with the certificate.
func TestKeyBuiltinsWork(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 4096)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "wb test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	src := fmt.Sprintf("package wb.admission\n\nkey := `%s`\n\ncert := `%s`\n\n", keyPEM, certPEM) + `
deny contains "key" if crypto.x509.parse_rsa_private_key(key).kty == "RSA"

deny contains "keys" if count(crypto.parse_private_keys(key)) == 1

deny contains "cert" if crypto.x509.parse_certificates(cert)[0].Subject.CommonName == "wb test"

deny contains "jwt" if {
	token := io.jwt.encode_sign({"alg": "RS256"}, {"sub": "x"}, crypto.x509.parse_rsa_private_key(key))
	io.jwt.verify_rs256(token, cert)
	[true, _, _] = io.jwt.decode_verify(token, {"cert": cert, "time": 0})
}
`
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second})
	if _, err := e.Put(ctx, "proj_keys", "keys", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission("proj_keys", 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"key", "keys", "cert", "jwt"} {
		if !slices.Contains(d.Reasons, "pol_keys@1: "+w) {
			t.Errorf("no reason %q in %q", w, d.Reasons)
		}
	}
}

// TestSubsetCountsLongElements: object.subset's bound weighs a string by its length, as
// comparing two equal strings reads them to their ends (arrays of 4,096 and 2,048 strings of
// 820 bytes took half a second in one call).
func TestSubsetCountsLongElements(t *testing.T) {
	long := func(n int) *ast.Term {
		ts := make([]*ast.Term, n)
		for i := range ts {
			ts[i] = ast.StringTerm(strings.Repeat("a", 820))
		}
		return ast.ArrayTerm(ts...)
	}
	if _, err := estimateSubset([]*ast.Term{long(4096), long(2048)}, 0, func() bool { return false }); err == nil {
		t.Error("object.subset of 4,096 and 2,048 strings of 820 bytes is taken, want it refused")
	}
	if _, err := estimateSubset([]*ast.Term{long(64), long(8)}, 0, func() bool { return false }); err != nil {
		t.Errorf("object.subset of 64 and 8 strings of 820 bytes: %v", err)
	}
}

// TestBoundedRealisticUses: the builtins bounded in work answer realistic calls as OPA does.
func TestBoundedRealisticUses(t *testing.T) {
	src := `package wb.admission

deny contains "duration" if time.parse_duration_ns("1y2w3d4h5m6s") == ((((365 + 14 + 3) * 24 + 4) * 60 + 5) * 60 + 6) * 1000000000

deny contains "duration without days" if time.parse_duration_ns("-1.5h30ms") == -5400030000000

nets := [sprintf("10.%d.0.0/16", [i]) | some i in numbers.range(0, 49)]

deny contains "matches" if {
	m := net.cidr_contains_matches(nets, [sprintf("10.%d.1.1", [i]) | some i in numbers.range(0, 19)])
	count(m) == 20
	[10, 10] in m
}

deny contains "matches by name" if {
	named := {sprintf("net%d", [i]): c | some i, c in nets}
	net.cidr_contains_matches(named, {"10.7.0.0/24", "11.0.0.1"}) == {["net7", "10.7.0.0/24"]}
}

deny contains "expand" if {
	addrs := net.cidr_expand("192.168.1.0/24")
	count(addrs) == 256
	"192.168.1.255" in addrs
}

deny contains "units" if {
	units.parse("1.5Ki") == 1536
	units.parse("1e3") == 1000
	units.parse("250m") == 0.25
	units.parse_bytes("2GiB") == 2147483648
	units.parse_bytes("1.5e2KB") == 150000
}

deny contains "merge" if {
	slash24s := [sprintf("10.0.%d.0/24", [i]) | some i in numbers.range(0, 255)]
	slash16s := [sprintf("11.%d.0.0/16", [i]) | some i in numbers.range(0, 43)]
	net.cidr_merge(array.concat(slash24s, slash16s)) == {"10.0.0.0/16", "11.0.0.0/11", "11.32.0.0/13", "11.40.0.0/14"}
}

deny contains "times" if {
	time.parse_ns("2006-01-02", "2020-01-02") == 1577923200000000000
	time.parse_rfc3339_ns("2020-01-02T03:04:05Z") == 1577934245000000000
	time.format([0, "America/New_York", "2006-01-02 MST"]) == "1969-12-31 EST"
	time.date([0, "Asia/Tokyo"]) == [1970, 1, 1]
	time.clock([0, "Asia/Kolkata"]) == [5, 30, 0]
	time.weekday(0) == "Thursday"
	time.add_date(0, 1, 0, 0) == 31536000000000000
	time.diff(0, 86400000000000) == [0, 0, 1, 0, 0, 0]
}

deny contains "versions" if {
	semver.compare("1.2.3", "1.10.0") == -1
	semver.compare("1.0.0-rc.1+build.5", "1.0.0") == -1
	semver.is_valid("1.0.0-alpha")
}
`
	want := []string{"duration", "duration without days", "matches", "matches by name", "expand", "units", "merge", "times", "versions"}
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: 10 * time.Second}) // a cold machine under -race is slow
	if _, err := e.Put(ctx, "proj_realistic", "realistic", src, ModeEnforce); err != nil {
		t.Fatal(err)
	}
	d, err := e.Admit(ctx, admission("proj_realistic", 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(d.Reasons, "pol_realistic@1: "+w) {
			t.Errorf("no reason %q in %q", w, d.Reasons)
		}
	}
}

// TestWithMocksBoundedBuiltins: a policy may replace a bounded builtin for one expression with
// the with keyword, as OPA allows for any builtin: by a value, by one of its functions, or by
// another builtin (which stays bounded), in the calls the expression makes through its rules
// too. The names the policy wrote did not resolve: the bounded builtins are known to the
// compiler under their bounded names only.
func TestWithMocksBoundedBuiltins(t *testing.T) {
	ctx := context.Background()
	src := `package wb.admission

fake(_, _) := "by a function"

joined := concat("-", ["a", "b"])

deny contains msg if {
	msg := concat("-", ["x"]) with concat as "by a value"
}

deny contains msg if {
	msg := sprintf("%d", [1]) with sprintf as fake
}

deny contains msg if {
	msg := joined with concat as "through a rule"
}

deny contains msg if {
	msg := upper("x") with upper as lower
}

deny contains joined
`
	_, doc, err := EvaluateLocal(ctx, "mock.rego", src, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(doc["deny"])
	if want := "[a-b by a function by a value through a rule x]"; got != want {
		t.Errorf("deny = %s; want %s", got, want)
	}
	// A builtin put in the place of another is its bounded version.
	_, _, err = EvaluateLocal(ctx, "mock.rego", `package wb.admission

deny contains msg if {
	msg := concat("%*s", ["3", "x"]) with concat as sprintf
}
`, map[string]any{})
	if err == nil || !strings.Contains(err.Error(), "sprintf: * widths and precisions are not allowed") || strings.Contains(err.Error(), boundedPrefix) {
		t.Errorf("concat replaced by sprintf, with a * width: %v; want bounded sprintf's error", err)
	}
	// Nothing out of the policies' reach comes back through with, and what with cannot
	// replace stays so.
	for _, tc := range []struct{ expr, msg string }{
		{`msg := concat("-", ["x"]) with concat as http.send`, "http.send"},
		{`msg := concat("-", ["x"]) with http.send as "x"`, "http.send"},
		{`msg := $"a{1}" with internal.template_string as "x"`, "internal.template_string"},
		{`msg := concat("-", ["x"]) with concat as opa.runtime`, "opa.runtime"},
	} {
		_, _, err := EvaluateLocal(ctx, "mock.rego", "package wb.admission\n\ndeny contains msg if {\n\t"+tc.expr+"\n}\n", map[string]any{})
		var ce *CompileError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.msg) || strings.Contains(err.Error(), boundedPrefix) {
			t.Errorf("%s: %v; want a compile error naming %s", tc.expr, err, tc.msg)
		}
	}
}

// TestUnitsExponentBounded: units.parse and units.parse_bytes are refused an exponent above
// maxNumberDigits before they compute it exactly ("1e999999" took half a second and a second).
func TestUnitsExponentBounded(t *testing.T) {
	never := func() bool { return false }
	for _, name := range []string{"units.parse", "units.parse_bytes"} {
		for s, refused := range map[string]bool{
			"1e999999": true, "1e-999999": true, "1.5E+999999Ki": true, `1e9"99999`: true, "1e1001": true,
			"1e1000": false, "1e-3": false, "1.5e2Ki": false, "10Mi": false, "250m": false, "1E": false, "2EiB": false,
		} {
			_, err := boundedBuiltins[name].estimate([]*ast.Term{ast.StringTerm(s)}, defaultEvalMemory, never)
			if (err != nil) != refused {
				t.Errorf("%s(%q): %v, want refused %v", name, s, err, refused)
			}
		}
	}
}

// TestTimeAndSemverTextsBounded: the time and semver builtins take texts of at most 1 KiB (time
// zone names 256 bytes): their errors quote their operands, escaped (4 MB of control bytes made
// time.parse_ns allocate 518 MiB, time.parse_rfc3339_ns 263 MiB in 855 ms), and Go reads a
// time zone name as a file name.
func TestTimeAndSemverTextsBounded(t *testing.T) {
	never := func() bool { return false }
	long, ok := strings.Repeat("\x01", 1025), "2006-01-02"
	tz := func(zone, layout string) *ast.Term {
		return ast.ArrayTerm(ast.NumberTerm("0"), ast.StringTerm(zone), ast.StringTerm(layout))
	}
	s := ast.StringTerm
	for _, c := range []struct {
		name    string
		ops     []*ast.Term
		refused bool
	}{
		{"time.parse_ns", []*ast.Term{s(ok), s(long)}, true},
		{"time.parse_ns", []*ast.Term{s(long), s(ok)}, true},
		{"time.parse_ns", []*ast.Term{s(ok), s("2020-01-02")}, false},
		{"time.parse_rfc3339_ns", []*ast.Term{s(long)}, true},
		{"time.parse_rfc3339_ns", []*ast.Term{s("2020-01-02T03:04:05Z")}, false},
		{"semver.compare", []*ast.Term{s("1.0.0"), s(long)}, true},
		{"semver.compare", []*ast.Term{s(long), s("1.0.0")}, true},
		{"semver.compare", []*ast.Term{s("1.0.0-rc.1+build.5"), s("1.0.0")}, false},
		{"time.format", []*ast.Term{tz("UTC", long)}, true},
		{"time.format", []*ast.Term{tz(strings.Repeat("a", 257), ok)}, true},
		{"time.format", []*ast.Term{tz("America/New_York", ok)}, false},
		{"time.format", []*ast.Term{ast.NumberTerm("0")}, false},
		{"time.date", []*ast.Term{tz(strings.Repeat("a", 257), "")}, true},
		{"time.clock", []*ast.Term{tz(strings.Repeat("a", 257), "")}, true},
		{"time.weekday", []*ast.Term{tz(strings.Repeat("a", 257), "")}, true},
		{"time.add_date", []*ast.Term{tz(strings.Repeat("a", 257), ""), ast.NumberTerm("1"), ast.NumberTerm("1"), ast.NumberTerm("1")}, true},
		{"time.diff", []*ast.Term{ast.NumberTerm("0"), tz(strings.Repeat("a", 257), "")}, true},
		{"time.diff", []*ast.Term{tz("Europe/Paris", ""), tz("Asia/Tokyo", "")}, false},
		// semver.is_valid parses as semver.compare does: 4 MB of control bytes before ".1.1"
		// allocated 135 MiB in 330 ms, uncharged, for an error it answers false for.
		{"semver.is_valid", []*ast.Term{s(long + ".1.1")}, true},
		{"semver.is_valid", []*ast.Term{s("1.0.0-rc.1+build.5")}, false},
	} {
		var err error
		if est := boundedBuiltins[c.name].estimate; est != nil {
			_, err = est(c.ops, defaultEvalMemory, never)
		}
		if (err != nil) != c.refused {
			t.Errorf("%s(%.40v): %v, want refused %v", c.name, c.ops, err, c.refused)
		}
	}
}

// TestWithCannotSkipValueChecks: the value check follows every call of a builtin that may
// answer a collection, decided by the builtin called; a function's value is checked where it
// is made. So with cannot put a builtin that may answer a collection in the place of a builtin
// that answers a scalar, or of a function of the policy: its answers went unchecked wherever
// the expression called the target (json.patch's copies made 2^24 elements from [1] under
// equal's name, and comparing two of them ran 3 s past a 250 ms deadline). In the place of a
// builtin that answers a collection it is checked, and a scalar builtin may replace any.
func TestWithCannotSkipValueChecks(t *testing.T) {
	ctx := context.Background()
	for _, expr := range []string{
		`x := equal([1], [{"op": "copy", "from": "", "path": "/-"}]) with equal as json.patch`,
		`x := lt([1], [2]) with lt as array.concat`,
		`x := f([1], [2]) with f as array.concat`,
		`x := f([1], [2]) with data.wb.admission.f as object.union`,
		`x := object.subset({}, {}) with object.subset as object.union`,
		`x := equal([1], []) with equal as wb["bounded"]["json"]["patch"]`,
	} {
		_, _, err := EvaluateLocal(ctx, "mock.rego", "package wb.admission\n\nf(_, _) := 1\n\ndeny contains msg if {\n\t"+expr+"\n\tmsg := \"x\"\n}\n", map[string]any{})
		var ce *CompileError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "collection") || strings.Contains(err.Error(), boundedPrefix) {
			t.Errorf("%s: %v; want a compile error saying its answer may be a collection", expr, err)
		}
	}
	for _, expr := range []string{
		`x := union({{1}}) with union as intersection`,
		`x := json.patch([1], []) with json.patch as array.concat`,
		`x := equal(1, 2) with equal as lt`,
		`x := array.concat([1], [2]) with array.concat as f`,
	} {
		if _, _, err := EvaluateLocal(ctx, "mock.rego", "package wb.admission\n\nf(_, _) := 1\n\ndeny contains msg if {\n\t"+expr+"\n\tmsg := \"x\"\n}\n", map[string]any{}); err != nil {
			t.Errorf("%s: %v; want it to compile and run", expr, err)
		}
	}
}
