package redistest

import (
	"strings"
	"testing"
)

// TestParseSetBenchmarkCSV: the baseline's numbers from redis-benchmark 7's --csv output
// (captured here), and an error naming what is missing otherwise.
func TestParseSetBenchmarkCSV(t *testing.T) {
	t.Parallel()
	out := "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n" +
		"\"SET\",\"20533.88\",\"0.517\",\"0.064\",\"0.271\",\"1.207\",\"4.479\",\"84.671\"\n"
	r, err := parseSetBenchmarkCSV([]byte(out))
	if err != nil || r != (SetBenchmark{RPS: 20533.88, P50ms: 0.271, P99ms: 4.479}) {
		t.Fatalf("%+v %v", r, err)
	}
	for _, c := range []struct{ out, want string }{
		{"", "0 lines"},
		{"\"test\",\"rps\"\n\"SET\",\"1\"\n", `no column "p50_latency_ms"`},
		{"\"test\",\"rps\",\"p50_latency_ms\",\"p99_latency_ms\"\n\"SET\",\"x\",\"1\",\"1\"\n", `column "rps"`},
		{"\"a\n", "redis-benchmark --csv"},
	} {
		if _, err := parseSetBenchmarkCSV([]byte(c.out)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %s", c.out, err, c.want)
		}
	}
}
