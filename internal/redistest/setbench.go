package redistest

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os/exec"
	"strconv"
)

// SetBenchmark is one run of redis-benchmark's SET: the baseline that the store's scripts
// and the gateway's saturated creates are read against, in the same run.
type SetBenchmark struct {
	RPS          float64 // requests a second
	P50ms, P99ms float64
}

// RunSetBenchmark runs redis-benchmark (Debian package redis-tools) against the redis-server
// at addr: SET from clients connections, n requests.
func RunSetBenchmark(ctx context.Context, addr string, clients, n int) (SetBenchmark, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return SetBenchmark{}, fmt.Errorf("redis-benchmark (Debian package redis-tools) is not installed: %w", err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return SetBenchmark{}, err
	}
	out, err := exec.CommandContext(ctx, bin, "-h", host, "-p", port, "-c", strconv.Itoa(clients), "-t", "set",
		"-n", strconv.Itoa(n), "--csv").Output()
	if err != nil {
		return SetBenchmark{}, fmt.Errorf("redis-benchmark: %w", err)
	}
	return parseSetBenchmarkCSV(out)
}

// parseSetBenchmarkCSV reads redis-benchmark --csv's SET line: requests per second, and its
// p50 and p99 in milliseconds.
func parseSetBenchmarkCSV(out []byte) (SetBenchmark, error) {
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil {
		return SetBenchmark{}, fmt.Errorf("redis-benchmark --csv: %w", err)
	}
	if len(recs) < 2 {
		return SetBenchmark{}, fmt.Errorf("redis-benchmark --csv: %d lines, want a header and SET: %q", len(recs), out)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	var res SetBenchmark
	for _, c := range []struct {
		name string
		v    *float64
	}{{"rps", &res.RPS}, {"p50_latency_ms", &res.P50ms}, {"p99_latency_ms", &res.P99ms}} {
		name, v := c.name, c.v
		i, ok := col[name]
		if !ok || i >= len(recs[1]) {
			return SetBenchmark{}, fmt.Errorf("redis-benchmark --csv: no column %q in %q", name, recs[0])
		}
		if *v, err = strconv.ParseFloat(recs[1][i], 64); err != nil {
			return SetBenchmark{}, fmt.Errorf("redis-benchmark --csv: column %q: %w", name, err)
		}
	}
	return res, nil
}
