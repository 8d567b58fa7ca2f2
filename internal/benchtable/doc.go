// Package benchtable reads `go test -bench` output and prints one table: each figure, the
// baseline it is read against (measured in the same run), and the ratio of the two.
//
// A figure alone says little on a shared, loaded machine: 400 µs for a create means nothing
// until it stands beside a Redis round trip measured in the same minutes. The benchmarks
// already measure such baselines (a bare Redis GET, a bare python3, a hand-written HTTP
// exchange, …), but under names of their own choosing, on the same line as the figure or on
// another benchmark's. Which figure is read against which baseline is declared in one place,
// Pairs (pairs.go), a table the reader can check; a test holds it to what the benchmarks
// report. A figure with no declared baseline is listed with "—"; a baseline used by some
// figure is listed only in that figure's row.
//
// The input is the standard benchmark format (golang.org/x/perf/benchfmt parses it); lines
// that are not results (logs, PASS, ok …) are skipped, and a malformed result line is
// reported, never fatal. A benchmark reported more than once (-count) is shown as its mean.
package benchtable
