package gateway

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkCreateSaturated: POST /v1/sessions saturated by wrk from 16 connections for 5 s,
// the figure read beside redis-benchmark's SET from 16 clients (store's
// BenchmarkRedisBenchmarkSet). wrk is to HTTP what redis-benchmark is to Redis: a C client
// on epoll that costs the machine little, so the ratio compares servers. (BenchmarkCreateSession's
// clients are Go's net/http in the gateway's own process: on two cores they took a good part
// of the CPU that the creates/s figure then lacked.)
func BenchmarkCreateSaturated(b *testing.B) {
	bin, err := exec.LookPath("wrk")
	if err != nil {
		b.Fatalf("wrk (Debian package wrk) is not installed: %v", err)
	}
	url, key, _ := benchServer(b)
	script := filepath.Join(b.TempDir(), "create.lua")
	if err := os.WriteFile(script, []byte(wrkCreateScript(key)), 0o600); err != nil {
		b.Fatal(err)
	}
	var res wrkResult
	for b.Loop() {
		out, err := exec.CommandContext(b.Context(), bin, "-t2", "-c16", "-d5s", "-s", script, url+"/v1/sessions").CombinedOutput()
		if err != nil {
			b.Fatalf("wrk: %v\n%s", err, out)
		}
		if res, err = parseWrk(out); err != nil {
			b.Fatal(err)
		}
		if res.failed > 0 {
			b.Fatalf("wrk: %d of %d creates failed (an error status, or no answer)\n%s", res.failed, res.requests, out)
		}
	}
	b.ReportMetric(res.perSec, "creates/s")
	b.ReportMetric(res.p50us, "p50-µs")
	b.ReportMetric(res.p99us, "p99-µs")
}

// wrkCreateScript is wrk's script for creates with key: every request the same POST, and a
// summary line that parseWrk reads (requests, duration µs, failures, p50 µs, p99 µs). A
// failure is an answer of 400 or more, or none. (A response() hook to count answers other
// than 201 would make wrk parse every answer in Lua, and the create answers 201 or an error.)
func wrkCreateScript(key string) string {
	return fmt.Sprintf(`wrk.method = "POST"
wrk.body = %q
wrk.headers["Authorization"] = %q
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("wb-summary %%d %%d %%d %%d %%d\n", summary.requests, summary.duration,
    e.status + e.connect + e.read + e.write + e.timeout, latency:percentile(50), latency:percentile(99)))
end
`, string(createBody), "Bearer "+key)
}

type wrkResult struct {
	requests, failed     int64
	perSec, p50us, p99us float64
}

// parseWrk reads the summary line of wrkCreateScript's done().
func parseWrk(out []byte) (wrkResult, error) {
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) != 6 || f[0] != "wb-summary" {
			continue
		}
		var v [5]int64
		for i := range v {
			n, err := strconv.ParseInt(f[i+1], 10, 64)
			if err != nil {
				return wrkResult{}, fmt.Errorf("wrk's summary %q: field %d: %w", strings.TrimSpace(line), i+1, err)
			}
			v[i] = n
		}
		if v[0] == 0 || v[1] <= 0 {
			return wrkResult{}, fmt.Errorf("wrk's summary %q: no request answered", strings.TrimSpace(line))
		}
		return wrkResult{requests: v[0], failed: v[2], perSec: float64(v[0]) / (float64(v[1]) / 1e6),
			p50us: float64(v[3]), p99us: float64(v[4])}, nil
	}
	return wrkResult{}, fmt.Errorf("wrk printed no summary line: %q", out)
}

// TestParseWrk: the summary line of wrkCreateScript's done() as wrk 4.1 prints it after its
// own report; a run with no answer, or no summary, is an error.
func TestParseWrk(t *testing.T) {
	out := []byte("Running 5s test @ http://127.0.0.1:1/v1/sessions\n  2 threads and 16 connections\n" +
		"  6000 requests in 5.00s, 9.00MB read\nRequests/sec:   1200.00\nwb-summary 6000 5000000 3 1500 9000\n")
	got, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := (wrkResult{requests: 6000, failed: 3, perSec: 1200, p50us: 1500, p99us: 9000}); got != want {
		t.Errorf("parseWrk = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"Requests/sec: 1200\n", "wb-summary 0 5000000 0 0 0\n", "wb-summary 10 x 0 1 2\n"} {
		if _, err := parseWrk([]byte(bad)); err == nil {
			t.Errorf("parseWrk(%q) succeeded", bad)
		}
	}
}
