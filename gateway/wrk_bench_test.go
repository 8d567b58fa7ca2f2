package gateway

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkCreateSaturated: POST /v1/sessions saturated by wrk from 16 connections for 5 s,
// the figure read beside redis-benchmark's SET from 16 clients (store's
// BenchmarkRedisBenchmarkSet). wrk is to HTTP what redis-benchmark is to Redis: a C client
// on epoll that costs the machine little, so the ratio compares servers. (BenchmarkCreateSession's
// clients are Go's net/http in the gateway's own process: on two cores they took a good part
// of the CPU that the creates/s figure then lacked.)
func BenchmarkCreateSaturated(b *testing.B) {
	url, key := wrkServer(b)
	var res wrkResult
	for b.Loop() {
		res = saturate(b, url, key, 5*time.Second)
	}
	b.ReportMetric(res.perSec, "creates/s")
	b.ReportMetric(res.p50us, "p50-µs")
	b.ReportMetric(res.p99us, "p99-µs")
}

// BenchmarkCreateHalfSaturated: the latency target is "at half of saturation": wrk
// finds the saturated rate (3 s), then creates arrive open loop at half of it for 5 s, from
// a process of their own (this test binary again, TestOpenLoopClient), each measured from
// when it was due, so that a stall counts as its callers would feel it (no coordinated
// omission). The client is Go's net/http, which costs the machine more than wrk does.
func BenchmarkCreateHalfSaturated(b *testing.B) {
	url, key := wrkServer(b)
	var rate, p50, p99 float64
	for b.Loop() {
		rate = saturate(b, url, key, 3*time.Second).perSec / 2
		cmd := exec.CommandContext(b.Context(), os.Args[0], "-test.run=^TestOpenLoopClient$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("WB_OPEN_LOOP=%s %s %.0f 5", url, key, rate))
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("the open-loop client: %v\n%s", err, out)
		}
		if _, err := fmt.Sscanf(lineAfter(string(out), "wb-open-loop "), "%g %g", &p50, &p99); err != nil {
			b.Fatalf("the open-loop client's summary: %v\n%s", err, out)
		}
	}
	b.ReportMetric(rate, "creates/s")
	b.ReportMetric(p50, "p50-µs")
	b.ReportMetric(p99, "p99-µs")
	b.ReportMetric(p99/p50, "p99/p50")
}

// TestOpenLoopClient is BenchmarkCreateHalfSaturated's client, in a process of its own: with
// WB_OPEN_LOOP="URL KEY RATE SECONDS" it sends creates at RATE per second for SECONDS,
// create i due at start + i/RATE whatever came before, and prints "wb-open-loop P50 P99" in
// µs, each create measured from when it was due. Any failed create fails it.
func TestOpenLoopClient(t *testing.T) {
	spec := os.Getenv("WB_OPEN_LOOP")
	if spec == "" {
		t.Skip("BenchmarkCreateHalfSaturated's client; runs when it sets WB_OPEN_LOOP")
	}
	var url, key string
	var rate, secs float64
	if _, err := fmt.Sscanf(spec, "%s %s %g %g", &url, &key, &rate, &secs); err != nil || rate*secs < 1 {
		t.Fatalf("WB_OPEN_LOOP %q: want URL KEY RATE SECONDS, at least one create (%v)", spec, err)
	}
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}, Timeout: 30 * time.Second}
	n := int(rate * secs)
	lat := make([]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		time.Sleep(time.Until(due))
		wg.Go(func() {
			if _, err := post(c, url, key); err != nil {
				errs <- err
			}
			lat[i] = time.Since(due)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a create failed (of %d): %v", n, err)
	}
	slices.Sort(lat)
	q := func(p float64) int64 { return lat[int(float64(n-1)*p)].Microseconds() }
	fmt.Printf("wb-open-loop %d %d\n", q(0.5), q(0.99))
}

// lineAfter is the rest of out's first line that starts with prefix ("" when none does).
func lineAfter(out, prefix string) string {
	for line := range strings.Lines(out) {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			return rest
		}
	}
	return ""
}

// wrkServer is benchServer for a load from wrk.
func wrkServer(b *testing.B) (url, key string) {
	if _, err := exec.LookPath("wrk"); err != nil {
		b.Fatalf("wrk (Debian package wrk) is not installed: %v", err)
	}
	url, key, _ = benchServer(b)
	return url, key
}

// saturate runs wrk's creates from 16 connections for d.
func saturate(b *testing.B, url, key string, d time.Duration) wrkResult {
	script := filepath.Join(b.TempDir(), "create.lua")
	if err := os.WriteFile(script, []byte(wrkCreateScript(key)), 0o600); err != nil {
		b.Fatal(err)
	}
	out, err := exec.CommandContext(b.Context(), "wrk", "-t2", "-c16", "-d"+d.String(), "-s", script, url+"/v1/sessions").CombinedOutput()
	if err != nil {
		b.Fatalf("wrk: %v\n%s", err, out)
	}
	res, err := parseWrk(out)
	if err != nil {
		b.Fatal(err)
	}
	if res.failed > 0 {
		b.Fatalf("wrk: %d of %d creates failed (an error status, or no answer)\n%s", res.failed, res.requests, out)
	}
	return res
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
