package benchtable

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strconv"
	"strings"
	"text/tabwriter"

	"golang.org/x/perf/benchfmt"
)

// Measure is one metric of one benchmark in a run: the mean of its N results.
type Measure struct {
	Ref
	Value float64
	N     int
}

// Run is what Parse read: every metric in the order it first appeared, and the result
// lines that could not be parsed ("file:line: why").
type Run struct {
	Measures []Measure
	Skipped  []string
}

// Parse reads go test -bench output. Only a failure to read is an error; a malformed
// result line is noted in Skipped and the rest is read.
func Parse(r io.Reader, name string) (Run, error) {
	var run Run
	index := map[Ref]int{}
	br := benchfmt.NewReader(r, name)
	for br.Scan() {
		switch rec := br.Result().(type) {
		case *benchfmt.SyntaxError:
			run.Skipped = append(run.Skipped, rec.Error())
		case *benchfmt.Result:
			bench := benchName(rec.Name)
			pkg := rec.GetConfig("pkg")
			for _, v := range rec.Values {
				ref := Ref{Pkg: pkg, Bench: bench, Unit: v.Unit}
				i, ok := index[ref]
				if !ok {
					i = len(run.Measures)
					index[ref] = i
					run.Measures = append(run.Measures, Measure{Ref: ref})
				}
				m := &run.Measures[i]
				m.N++
				m.Value += (v.Value - m.Value) / float64(m.N) // a running mean
			}
		}
	}
	if err := br.Err(); err != nil {
		return run, fmt.Errorf("read benchmark output %s: %w", name, err)
	}
	return run, nil
}

// benchName is a result's name without its -GOMAXPROCS suffix ("Dial/bare-2" → "Dial/bare").
func benchName(n benchfmt.Name) string {
	base, parts := n.Parts()
	var b strings.Builder
	b.Write(base)
	for _, p := range parts {
		if len(p) > 0 && p[0] != '-' {
			b.Write(p)
		}
	}
	return b.String()
}

// hidden are the measures the table leaves out (the raw output keeps them): memory per op is
// beside the point of a figure against its baseline, and the time per op of a benchmark that
// measures CPU over a window of its own (IdleCPU, IdleGuest) is a few nanoseconds of an
// empty loop.
func hidden(m Measure) bool {
	base, _, _ := strings.Cut(m.Bench, "/")
	return m.Unit == "B/op" || m.Unit == "allocs/op" || m.Unit == "sec/op" && (base == "IdleCPU" || base == "IdleGuest")
}

// Row is one line of the table. Baseline is nil when the figure has no declared baseline
// (Want is then zero) or when the declared one is not in the run (Want names it).
type Row struct {
	Figure   Measure
	Want     Ref
	Baseline *Measure
	Why      string
}

// Ratio is figure/baseline, in seconds when both are times and per second when both are
// rates; ok is false when there is no baseline, it is zero, or the units do not compare.
func (r Row) Ratio() (ratio float64, ok bool) {
	if r.Baseline == nil {
		return 0, false
	}
	fs, bs, ok := compare(r.Figure.Unit, r.Baseline.Unit)
	if !ok {
		return 0, false
	}
	ratio = (r.Figure.Value * fs) / (r.Baseline.Value * bs)
	if math.IsNaN(ratio) || math.IsInf(ratio, 0) {
		return 0, false
	}
	return ratio, true
}

// compare answers the factors that bring values of two units to one: 1 and 1 for the same
// unit or two rates (ops/s beside requests/s), seconds for two times (sec/op beside p50-µs).
func compare(a, b string) (fa, fb float64, ok bool) {
	if a == b || (rate(a) && rate(b)) {
		return 1, 1, true
	}
	fa, oka := seconds(a)
	fb, okb := seconds(b)
	return fa, fb, oka && okb
}

// rate reports whether unit counts something per second ("creates/s").
func rate(unit string) bool { return strings.HasSuffix(unit, "/s") && len(unit) > len("/s") }

// seconds answers how many seconds one of unit is, for the time units the benchmarks use.
func seconds(unit string) (float64, bool) {
	if unit == "sec/op" {
		return 1, true
	}
	for _, s := range []struct {
		suffix string
		sec    float64
	}{{"ns", 1e-9}, {"µs", 1e-6}, {"us", 1e-6}, {"ms", 1e-3}} {
		if strings.HasSuffix(unit, "-"+s.suffix) || strings.HasSuffix(unit, "_"+s.suffix) {
			return s.sec, true
		}
	}
	return 0, false
}

// Validate checks a declaration: every field named, every pattern well formed, the units
// of each pair comparable.
func Validate(pairs []Pair) error {
	var errs []error
	for i, p := range pairs {
		at := fmt.Sprintf("pair %d (%s %s %s)", i, p.Figure.Pkg, p.Figure.Bench, p.Figure.Unit)
		if p.Figure.Pkg == "" || p.Figure.Bench == "" || p.Figure.Unit == "" {
			errs = append(errs, fmt.Errorf("%s: the figure's pkg, bench and unit are all needed", at))
		}
		if p.Baseline.Unit == "" {
			errs = append(errs, fmt.Errorf("%s: the baseline's unit is needed", at))
		}
		if _, err := path.Match(p.Figure.Bench, ""); err != nil {
			errs = append(errs, fmt.Errorf("%s: figure bench pattern: %w", at, err))
		}
		if p.Baseline == p.Figure || (p.Baseline.Pkg == "" && p.Baseline.Bench == "" && p.Baseline.Unit == p.Figure.Unit) {
			errs = append(errs, fmt.Errorf("%s: the baseline is the figure itself", at))
		}
		if _, _, ok := compare(p.Figure.Unit, p.Baseline.Unit); !ok {
			errs = append(errs, fmt.Errorf("%s: units %q and %q do not compare", at, p.Figure.Unit, p.Baseline.Unit))
		}
	}
	return errors.Join(errs...)
}

// matches reports whether the figure side of p names m.
func (p Pair) matches(m Ref) bool {
	if p.Figure.Pkg != m.Pkg || p.Figure.Unit != m.Unit {
		return false
	}
	ok, err := path.Match(p.Figure.Bench, m.Bench)
	return err == nil && ok
}

// baselineOf is the baseline p declares for the figure m.
func (p Pair) baselineOf(m Ref) Ref {
	b := p.Baseline
	if b.Pkg == "" {
		b.Pkg = m.Pkg
	}
	if b.Bench == "" {
		b.Bench = m.Bench
	}
	return b
}

// Table pairs the run's figures with their baselines: a row per declared pair whose figure
// is in the run, and one, without a baseline, for every other metric except those shown as
// some row's baseline and the hidden units. Rows keep the run's order.
func Table(run Run, pairs []Pair) []Row {
	index := make(map[Ref]int, len(run.Measures))
	for i, m := range run.Measures {
		index[m.Ref] = i
	}
	paired := make([][]Row, len(run.Measures))
	shown := map[Ref]bool{} // baselines that some row shows
	for i, m := range run.Measures {
		for _, p := range pairs {
			if !p.matches(m.Ref) {
				continue
			}
			row := Row{Figure: m, Want: p.baselineOf(m.Ref), Why: p.Why}
			if j, ok := index[row.Want]; ok {
				row.Baseline = &run.Measures[j]
				shown[row.Want] = true
			}
			paired[i] = append(paired[i], row)
		}
	}
	var rows []Row
	for i, m := range run.Measures {
		switch {
		case len(paired[i]) > 0:
			rows = append(rows, paired[i]...)
		case hidden(m) || shown[m.Ref]:
		default:
			rows = append(rows, Row{Figure: m})
		}
	}
	return rows
}

// Write prints rows as an aligned table: package, benchmark, figure, baseline, ratio.
func Write(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PACKAGE\tBENCHMARK\tFIGURE\tBASELINE (same run)\tFIGURE/BASELINE")
	for _, r := range rows {
		f := r.Figure
		base, ratio := "—", "—"
		switch {
		case r.Baseline != nil:
			base = value(*r.Baseline)
			if r.Want.Bench != f.Bench || r.Want.Pkg != f.Pkg {
				base = where(r.Want, f.Ref) + ": " + base
			}
			if x, ok := r.Ratio(); ok {
				ratio = fmt.Sprintf("%.3g×", x)
			}
		case r.Want != Ref{}:
			base = "— (" + strings.TrimSpace(where(r.Want, f.Ref)+" "+r.Want.Unit) + " not in this run)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.TrimPrefix(f.Pkg, "wb/"), f.Bench, value(f), base, ratio)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the table: %w", err)
	}
	return nil
}

// where names b relative to the figure's own benchmark: the package only when it differs.
func where(b, fig Ref) string {
	if b.Pkg != fig.Pkg {
		return strings.TrimPrefix(b.Pkg, "wb/") + " " + b.Bench
	}
	if b.Bench != fig.Bench {
		return b.Bench
	}
	return ""
}

// value prints a measure with its unit: times per op in a readable unit, the rest as
// reported, with the count of results when it is a mean.
func value(m Measure) string {
	var s string
	if m.Unit == "sec/op" {
		s = duration(m.Value) + "/op"
	} else {
		s = number(m.Value) + " " + m.Unit
	}
	if m.N > 1 {
		s += fmt.Sprintf(" (mean of %d)", m.N)
	}
	return s
}

// duration prints v seconds in s, ms, µs or ns, whichever reads best.
func duration(v float64) string {
	for _, u := range []struct {
		name string
		sec  float64
	}{{"s", 1}, {"ms", 1e-3}, {"µs", 1e-6}} {
		if math.Abs(v) >= u.sec {
			return number(v/u.sec) + u.name
		}
	}
	return number(v/1e-9) + "ns"
}

// number prints v with four significant digits, and whole when it is larger (23771, not
// 2.377e+04).
func number(v float64) string {
	if a := math.Abs(v); a >= 1e4 && a < 1e15 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}
