package benchtable

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func parseFile(t *testing.T, name string) Run {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	run, err := Parse(f, name)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func find(run Run, ref Ref) (Measure, bool) {
	for _, m := range run.Measures {
		if m.Ref == ref {
			return m, true
		}
	}
	return Measure{}, false
}

// Output captured from go test -bench on this machine: names lose Benchmark and the
// -GOMAXPROCS suffix, ns/op becomes sec/op, each result keeps its package, and the log lines
// of --- BENCH, PASS and ok are not results.
func TestParseCaptured(t *testing.T) {
	run := parseFile(t, "captured.txt")
	if len(run.Skipped) != 0 {
		t.Errorf("skipped %q", run.Skipped)
	}
	for _, want := range []Measure{
		{Ref{"wb/store", "RedisBenchmarkSet", "sec/op"}, 7.214255976, 1},
		{Ref{"wb/store", "RedisBenchmarkSet", "p50-µs"}, 287, 1},
		{Ref{"wb/store", "RedisBenchmarkSet", "requests/s"}, 13930, 1},
		{Ref{"wb/gateway", "RedisPing", "p99-µs"}, 3875, 1},
		{Ref{"wb/gateway", "RedisPing", "pings/s"}, 23771, 1},
		{Ref{"wb/hypervisor/oci", "CreateBoot/bare-runc", "sec/op"}, 1.12353494, 1},
		{Ref{"wb/hypervisor/oci", "CreateBoot/runc", "sec/op"}, 2.020226955, 1},
	} {
		got, ok := find(run, want.Ref)
		if !ok {
			t.Errorf("no %+v in %+v", want.Ref, run.Measures)
			continue
		}
		if got.N != want.N || math.Abs(got.Value-want.Value) > 1e-9*math.Abs(want.Value) {
			t.Errorf("%+v: %v (n=%d), want %v (n=%d)", want.Ref, got.Value, got.N, want.Value, want.N)
		}
	}
	if len(run.Measures) != 10 {
		t.Errorf("%d measures, want 10: %+v", len(run.Measures), run.Measures)
	}
}

// A benchmark reported more than once (-count) is its mean; a malformed result line is
// noted and the rest is read.
func TestParseMeanAndMalformed(t *testing.T) {
	in := "pkg: wb/x\nBenchmarkA-2 10 100 ns/op 3 p50-µs\nBenchmarkA-2 10 300 ns/op 5 p50-µs\nBenchmarkB-2 10 abc ns/op\nBenchmarkC 1 7 things/s\n"
	run, err := Parse(strings.NewReader(in), "in")
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := find(run, Ref{"wb/x", "A", "sec/op"}); m.N != 2 || math.Abs(m.Value-200e-9) > 1e-15 {
		t.Errorf("A sec/op: %+v, want the mean of 2, 200 ns", m)
	}
	if m, _ := find(run, Ref{"wb/x", "A", "p50-µs"}); m.N != 2 || m.Value != 4 {
		t.Errorf("A p50-µs: %+v, want 4", m)
	}
	if m, ok := find(run, Ref{"wb/x", "C", "things/s"}); !ok || m.Value != 7 {
		t.Errorf("C after the malformed line: %+v %v", m, ok)
	}
	if len(run.Skipped) != 1 || !strings.Contains(run.Skipped[0], "in:4") {
		t.Errorf("skipped %q, want line 4 named", run.Skipped)
	}
}

// The table on captured output with the real declaration: the driver's create and boot is
// read against the bare runc run, with their ratio; the bare run has no row of its own; a
// figure whose baseline did not run says which; a metric nobody pairs stands alone with —.
func TestTableCaptured(t *testing.T) {
	run := parseFile(t, "captured.txt")
	rows := Table(run, Pairs())
	var boot *Row
	for i, r := range rows {
		if r.Figure.Ref == (Ref{"wb/hypervisor/oci", "CreateBoot/runc", "sec/op"}) {
			boot = &rows[i]
		}
		if r.Figure.Bench == "CreateBoot/bare-runc" {
			t.Errorf("the baseline has a row of its own: %+v", r)
		}
	}
	if boot == nil || boot.Baseline == nil || boot.Baseline.Bench != "CreateBoot/bare-runc" {
		t.Fatalf("CreateBoot/runc row: %+v", boot)
	}
	if x, ok := boot.Ratio(); !ok || math.Abs(x-2020226955.0/1123534940) > 1e-9 {
		t.Errorf("ratio %v %v", x, ok)
	}
	var out bytes.Buffer
	if err := Write(&out, rows); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		`(?m)^PACKAGE +BENCHMARK +FIGURE +BASELINE \(same run\) +FIGURE/BASELINE$`,
		`(?m)^hypervisor/oci +CreateBoot/runc +2\.02s/op +CreateBoot/bare-runc: 1\.124s/op +1\.8×`,
		// Pings/s has no declared baseline, and no figure here is read against it.
		`(?m)^gateway +RedisPing +23771 pings/s +— +—`,
		// Nothing in the captured file pairs with the store's redis-benchmark line.
		`(?m)^store +RedisBenchmarkSet +287 p50-µs +— +—`,
	} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("the table has no line matching %s:\n%s", want, text)
		}
	}
}

// A whole make bench run (captured here; its hypervisor/oci part from a later run of that
// package alone at make bench's -benchtime 20x, on a loaded machine, once the pause and
// checkpoint baselines existed, and its RunsPython/bare- lines from a later run of that
// benchmark; its placer part from a later run of that package alone, once it had a
// benchmark; its gateway AuthzCheckH2load line from a later run of that benchmark alone, and
// its CreateSaturated and CreateHalfSaturated lines, with the floor, from runs of those
// benchmarks alone without -benchmem): every declared pair names a figure the benchmarks
// report, under the unit they report it with, and its baseline is in the same run.
func TestPairsMeetFullRun(t *testing.T) {
	run := parseFile(t, "make-bench.txt")
	if len(run.Skipped) != 0 {
		t.Errorf("skipped %q", run.Skipped)
	}
	rows := Table(run, Pairs())
	for _, p := range Pairs() {
		found := false
		for _, r := range rows {
			if p.matches(r.Figure.Ref) && r.Want == p.baselineOf(r.Figure.Ref) {
				found = true
				if r.Baseline == nil {
					t.Errorf("%s %s %s: its baseline %+v is not in the run", p.Figure.Pkg, r.Figure.Bench, p.Figure.Unit, r.Want)
				}
			}
		}
		if !found {
			t.Errorf("no figure in the run matches %+v", p.Figure)
		}
	}
	// Spot checks against the raw lines: the driver beside the bare runtime (boot, pause and
	// resume, checkpoint and restore), the API beside it, a run beside the bare python3, the
	// store beside redis-benchmark across a name, a package and a unit.
	for _, c := range []struct {
		fig  Ref
		want float64
	}{
		{Ref{"wb/hypervisor/oci", "CreateBoot/runsc", "sec/op"}, 4360347987.0 / 2266994840},
		{Ref{"wb/hypervisor/oci", "PauseResume/runc", "sec/op"}, 137083471.0 / 127442158},
		{Ref{"wb/hypervisor/oci", "PauseResume/runsc", "resume-p99-ms"}, 182.9 / 194.4},
		{Ref{"wb/hypervisor/oci", "CheckpointRestore/runsc", "sec/op"}, 2011135583.0 / 1998360255},
		{Ref{"wb/hypervisor/oci", "CheckpointRestore/runsc", "snapshot-p50-ms"}, 164.4 / 130.0},
		{Ref{"wb/conformance", "PauseResume/runsc", "pause-p50-ms"}, 59.06 / 113.6},
		{Ref{"wb/conformance", "SnapshotRestore/runsc", "snapshot-p50-ms"}, 309.4 / 130.0},
		{Ref{"wb/conformance", "SnapshotRestore/runsc", "back-p50-ms"}, 936.6 / 412.5},
		{Ref{"wb/conformance", "SnapshotRestore/runsc", "restore-p99-ms"}, 812.9 / 335.2},
		{Ref{"wb/conformance", "SnapshotRestore/runc", "snapshot-p50-ms"}, 70.85e-3 / 0.127442158},
		{Ref{"wb/conformance", "RunsPython/runc", "p50-ms"}, 163.2 / 12.53},
		{Ref{"wb/conformance", "RunsPython/runsc", "host-cpu-ms"}, 415.5 / 271.0},
		{Ref{"wb/quota", "Settler", "records/s"}, 67846.0 / 46083},
		{Ref{"wb/store", "ChangePublish", "sec/op"}, 254920e-9 / 165e-6},
	} {
		var got []float64
		for _, r := range rows {
			if r.Figure.Ref == c.fig {
				x, _ := r.Ratio()
				got = append(got, x)
			}
		}
		if len(got) != 1 || math.Abs(got[0]-c.want) > 1e-3*c.want {
			t.Errorf("%+v: ratios %v, want %.4g", c.fig, got, c.want)
		}
	}
}

// Issue 17: in a whole make bench run, every figure the OCI driver reports, and every pause,
// resume, snapshot and restore percentile of the platform's, stands beside a baseline of the same
// run (a bare runtime's), and the bare runs are shown only as baselines.
func TestPauseAndCheckpointHaveBaselines(t *testing.T) {
	run := parseFile(t, "make-bench.txt")
	rows := Table(run, Pairs())
	n := 0
	for _, r := range rows {
		f := r.Figure
		base, _, _ := strings.Cut(f.Bench, "/")
		switch {
		case f.Pkg == "wb/hypervisor/oci":
		case f.Pkg == "wb/conformance" && strings.HasSuffix(f.Unit, "-ms") && (base == "PauseResume" || base == "SnapshotRestore"):
		default:
			continue
		}
		n++
		if strings.Contains(f.Bench, "/bare-") {
			t.Errorf("%s %s %s: a bare run has a row of its own", f.Pkg, f.Bench, f.Unit)
			continue
		}
		if _, ok := r.Ratio(); !ok {
			t.Errorf("%s %s %s: no baseline and ratio (want %+v)", f.Pkg, f.Bench, f.Unit, r.Want)
		}
	}
	if n < 30 {
		t.Errorf("%d rows checked; the run lacks the OCI and conformance benchmarks", n)
	}
}

// Each way of naming a baseline: on the same line, a sibling, another package's, a pattern;
// a declared baseline not in the run; hidden units; a baseline shown beside its figure gets no
// row of its own, and one whose figure did not run keeps its own.
func TestTable(t *testing.T) {
	in := `pkg: wb/a
BenchmarkRuns/runc-2 20 1000000 ns/op 40 p50-ms 10 bare-p50-ms 200 B/op 3 allocs/op
BenchmarkDial/bare-2 100 2000 ns/op
BenchmarkDial/guarded-2 100 3000 ns/op
BenchmarkLonely-2 100 5 ns/op 7 widgets/s
BenchmarkOrphanBase-2 10 9 ns/op
pkg: wb/b
BenchmarkPing-2 100 50000 ns/op 40 p50-µs 0 zero/s 20 pings/s
BenchmarkCreate-2 100 100000 ns/op 400 p50-µs 3 zero/s 10 rate/s
`
	run, err := Parse(strings.NewReader(in), "in")
	if err != nil {
		t.Fatal(err)
	}
	pairs := []Pair{
		{Ref{"wb/a", "Runs/*", "p50-ms"}, Ref{"", "", "bare-p50-ms"}, "same line, by pattern"},
		{Ref{"wb/a", "Dial/guarded", "sec/op"}, Ref{"", "Dial/bare", "sec/op"}, "sibling"},
		{Ref{"wb/b", "Create", "p50-µs"}, Ref{"", "Ping", "p50-µs"}, "same package"},
		{Ref{"wb/b", "Create", "sec/op"}, Ref{"wb/a", "Runs/runc", "bare-p50-ms"}, "another package, ms beside s"},
		{Ref{"wb/a", "Lonely", "widgets/s"}, Ref{"", "Gone", "widgets/s"}, "not in the run"},
		{Ref{"wb/a", "NotRun", "sec/op"}, Ref{"", "OrphanBase", "sec/op"}, "figure not in the run"},
		{Ref{"wb/b", "Create", "zero/s"}, Ref{"", "Ping", "zero/s"}, "zero baseline: no ratio"},
		{Ref{"wb/b", "Create", "rate/s"}, Ref{"", "Ping", "pings/s"}, "rates compare"},
	}
	if err := Validate(pairs); err != nil {
		t.Fatal(err)
	}
	type line struct {
		fig, base string
		ratio     float64 // 0: none
	}
	var got []line
	for _, r := range Table(run, pairs) {
		l := line{fig: r.Figure.Bench + " " + r.Figure.Unit}
		if r.Baseline != nil {
			l.base = r.Baseline.Pkg + " " + r.Baseline.Bench + " " + r.Baseline.Unit
		} else if r.Want != (Ref{}) {
			l.base = "missing " + r.Want.Bench
		}
		if x, ok := r.Ratio(); ok {
			l.ratio = math.Round(x*1000) / 1000
		}
		got = append(got, l)
	}
	want := []line{
		{"Runs/runc sec/op", "", 0},
		{"Runs/runc p50-ms", "wb/a Runs/runc bare-p50-ms", 4},
		{"Dial/guarded sec/op", "wb/a Dial/bare sec/op", 1.5},
		{"Lonely sec/op", "", 0},
		{"Lonely widgets/s", "missing Gone", 0},
		{"OrphanBase sec/op", "", 0},
		{"Ping sec/op", "", 0}, // not a baseline: Ping's p50-µs is
		{"Create sec/op", "wb/a Runs/runc bare-p50-ms", 0.01},
		{"Create p50-µs", "wb/b Ping p50-µs", 10},
		{"Create zero/s", "wb/b Ping zero/s", 0},
		{"Create rate/s", "wb/b Ping pings/s", 0.5},
	}
	if len(got) != len(want) {
		t.Fatalf("rows:\n%+v\nwant:\n%+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestRatioUnits(t *testing.T) {
	for _, c := range []struct {
		fig, base Measure
		want      float64
		ok        bool
	}{
		{Measure{Ref: Ref{Unit: "p50-µs"}, Value: 500}, Measure{Ref: Ref{Unit: "sec/op"}, Value: 250e-6}, 2, true},
		{Measure{Ref: Ref{Unit: "p50_µs"}, Value: 3}, Measure{Ref: Ref{Unit: "p50-ms"}, Value: 0.001}, 3, true},
		{Measure{Ref: Ref{Unit: "p50-ns"}, Value: 3}, Measure{Ref: Ref{Unit: "p50-us"}, Value: 0.001}, 3, true},
		{Measure{Ref: Ref{Unit: "ops/s"}, Value: 5}, Measure{Ref: Ref{Unit: "ops/s"}, Value: 10}, 0.5, true},
		{Measure{Ref: Ref{Unit: "creates/s"}, Value: 5}, Measure{Ref: Ref{Unit: "pings/s"}, Value: 10}, 0.5, true},
		{Measure{Ref: Ref{Unit: "ops/s"}, Value: 5}, Measure{Ref: Ref{Unit: "p50-ms"}, Value: 10}, 0, false},
		{Measure{Ref: Ref{Unit: "sec/op"}, Value: 5}, Measure{Ref: Ref{Unit: "ops/s"}, Value: 10}, 0, false},
		{Measure{Ref: Ref{Unit: "widgets"}, Value: 5}, Measure{Ref: Ref{Unit: "gadgets"}, Value: 10}, 0, false},
		{Measure{Ref: Ref{Unit: "ops/s"}, Value: 5}, Measure{Ref: Ref{Unit: "ops/s"}, Value: 0}, 0, false},
		{Measure{Ref: Ref{Unit: "ops/s"}, Value: 0}, Measure{Ref: Ref{Unit: "ops/s"}, Value: 0}, 0, false},
		{Measure{Ref: Ref{Unit: "ops/s"}, Value: math.Inf(1)}, Measure{Ref: Ref{Unit: "ops/s"}, Value: 1}, 0, false},
	} {
		b := c.base
		x, ok := Row{Figure: c.fig, Baseline: &b}.Ratio()
		if ok != c.ok || math.Abs(x-c.want) > 1e-9 {
			t.Errorf("%v %s / %v %s: %v %v, want %v %v", c.fig.Value, c.fig.Unit, b.Value, b.Unit, x, ok, c.want, c.ok)
		}
	}
	if _, ok := (Row{Figure: Measure{Ref: Ref{Unit: "x/s"}, Value: 1}}).Ratio(); ok {
		t.Error("a ratio without a baseline")
	}
}

func TestValidateRejects(t *testing.T) {
	fig := Ref{"wb/a", "X", "p50-ms"}
	for _, c := range []struct {
		p    Pair
		want string
	}{
		{Pair{Ref{"wb/a", "X[", "p50-ms"}, Ref{"", "Y", "p50-ms"}, ""}, "pattern"},
		{Pair{fig, Ref{"", "Y", "ops/s"}, ""}, "do not compare"},
		{Pair{fig, Ref{"", "", "p50-ms"}, ""}, "the figure itself"},
		{Pair{fig, fig, ""}, "the figure itself"},
		{Pair{Ref{"", "X", "p50-ms"}, Ref{"", "Y", "p50-ms"}, ""}, "pkg, bench and unit"},
		{Pair{fig, Ref{"", "Y", ""}, ""}, "baseline's unit"},
	} {
		err := Validate([]Pair{c.p})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.p, err, c.want)
		}
	}
}

// The declaration is well formed, and every benchmark it names is a Benchmark function of
// the package it names (a renamed benchmark fails here, not silently in the table).
func TestPairsNameRealBenchmarks(t *testing.T) {
	pairs := Pairs()
	if err := Validate(pairs); err != nil {
		t.Fatal(err)
	}
	funcs := map[string]string{} // package → its test files' text
	check := func(pkg, bench string) {
		src, ok := funcs[pkg]
		if !ok {
			dir := filepath.Join("..", "..", strings.TrimPrefix(pkg, "wb/"))
			files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
			if err != nil || len(files) == 0 {
				t.Errorf("package %s: no test files in %s (%v)", pkg, dir, err)
			}
			var b strings.Builder
			for _, f := range files {
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				b.Write(data)
			}
			src = b.String()
			funcs[pkg] = src
		}
		base, _, _ := strings.Cut(bench, "/")
		if !strings.Contains(src, "func Benchmark"+base+"(b *testing.B)") {
			t.Errorf("%s has no func Benchmark%s", pkg, base)
		}
	}
	for _, p := range pairs {
		check(p.Figure.Pkg, p.Figure.Bench)
		b := p.baselineOf(p.Figure)
		check(b.Pkg, b.Bench)
	}
}

// Whatever the input, Parse, Table and Write neither panic nor print a ratio that is not a
// number.
func FuzzParse(f *testing.F) {
	captured, err := os.ReadFile(filepath.Join("testdata", "captured.txt"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(captured)
	f.Add([]byte("pkg: wb/a\nBenchmarkX-2 1 NaN ns/op Inf p50-µs\nBenchmarkX 1 0 ns/op\n"))
	f.Add([]byte("BenchmarkRuns/runc-2 20 1 ns/op 40 p50-ms 0 bare-p50-ms\n"))
	f.Add([]byte("Benchmark\nBenchmark-\nBenchmark 1\nBenchmarkA -1 1 x\nk: v\n\x00\xff"))
	pairs := Pairs()
	f.Fuzz(func(t *testing.T, data []byte) {
		run, err := Parse(bytes.NewReader(data), "fuzz")
		if err != nil {
			t.Fatalf("a bytes.Reader cannot fail to read: %v", err)
		}
		rows := Table(run, pairs)
		for _, r := range rows {
			if x, ok := r.Ratio(); ok && (math.IsNaN(x) || math.IsInf(x, 0)) {
				t.Fatalf("ratio %v for %+v", x, r)
			}
		}
		var out bytes.Buffer
		if err := Write(&out, rows); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "NaN×") {
			t.Fatalf("a NaN ratio printed:\n%s", out.String())
		}
	})
}
