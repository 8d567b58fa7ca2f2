package gateway

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/store"
)

// BenchmarkCreateSaturated: POST /v1/sessions saturated by wrk from 16 connections for 5 s,
// read beside redis-benchmark's SET from 16 clients against the gateway's own redis-server,
// run just before and just after wrk, so that the ratio compares two figures of the
// same minute. Three such rounds alternate (SET, creates, SET, creates, SET, creates, SET):
// creates/s is the median of the three create runs, redis-sets/s the median of the four SET
// runs, and ratio-median the median of each round's creates beside the mean of the SET runs
// around it. These hosts' speed swings with their neighbours' load: one round's ratio ranged
// 0.12–0.19 within an hour on one machine, as the SET rate beside it ranged 67k–93k. (The
// store's BenchmarkRedisBenchmarkSet, minutes earlier in make bench, measured 35k to 49k
// SET/s in four runs within a minute of each other.) wrk is to HTTP what redis-benchmark is
// to Redis: a C client on epoll that costs the machine little, so the ratio compares servers.
// (BenchmarkCreateSession's clients are Go's net/http in the gateway's own process: on two
// cores they took a good part of the CPU that the creates/s figure then lacked.)
//
// At 16 connections about a sixth of the two CPUs stays idle (each create waits for its
// round trip to Redis): creates-64conns/s is the same from 64, and always measured as many or
// more.
//
// A second baseline is the floor of any API on the gateway's stack: wrk's same POSTs to a
// net/http handler that reads the body, writes it to Redis with one SET (go-redis, the same
// redis-server) and answers 201 with the bytes of a create's answer (floorServer), run
// after the rounds: floor-requests/s.
//
// Rates swing with the machine and its load; what each operation costs it swings much less:
// Redis's CPU per create beside per SET (the admission script's cost), the gateway's CPU per
// create beside the floor's per request (the handler's own), and a log line of Redis's
// commands per create (cpuPerOp); the CPU figures are the rounds' medians.
func BenchmarkCreateSaturated(b *testing.B) {
	url, key, rdb := wrkServer(b)
	redisAddr := rdb.Options().Addr
	floorURL := floorServer(b, rdb, url, key)
	const rounds = 3
	var res, res64, floor wrkResult
	var sets redistest.SetBenchmark
	var createCPU, setCPU, floorCPU cpuPerOp
	var ratio float64
	for b.Loop() {
		var creates []wrkResult
		var createCPUs, setCPUs []cpuPerOp
		var setBench []redistest.SetBenchmark
		runSets := func() {
			var c cpuPerOp
			c.start(b, rdb)
			s := setBaseline(b, redisAddr)
			c.end(b, rdb, 100000)
			setBench = append(setBench, s)
			setCPUs = append(setCPUs, c)
		}
		runSets()
		for range rounds {
			// Each run of creates has a project of its own: a fast machine made 50,000
			// sessions in the first, and the second then reached the plan's 100,000 (the
			// most a plan may have; these sessions never end, for no node takes them).
			createKey := newKey(b, rdb)
			var c cpuPerOp
			c.start(b, rdb)
			r := saturate(b, url, createKey, 5*time.Second, 16)
			c.end(b, rdb, r.requests)
			creates, createCPUs = append(creates, r), append(createCPUs, c)
			runSets()
		}
		res64 = saturate(b, url, newKey(b, rdb), 5*time.Second, 64)
		floorCPU.start(b, rdb)
		floor = saturate(b, floorURL, key, 5*time.Second, 16)
		floorCPU.end(b, rdb, floor.requests)
		var ratios []float64
		for i, r := range creates {
			around := (setBench[i].RPS + setBench[i+1].RPS) / 2
			ratios = append(ratios, r.perSec/around)
			b.Logf("round %d: %.0f creates/s beside %.0f SET/s (before %.0f, after %.0f): %.3f", i+1, r.perSec, around, setBench[i].RPS, setBench[i+1].RPS, r.perSec/around)
		}
		ratio = medianBy(ratios, func(x float64) float64 { return x })
		res = medianBy(creates, func(r wrkResult) float64 { return r.perSec })
		sets = medianBy(setBench, func(s redistest.SetBenchmark) float64 { return s.RPS })
		redisOf := func(c cpuPerOp) float64 { return c.redis }
		createCPU = cpuPerOp{redis: medianBy(createCPUs, redisOf).redis, self: medianBy(createCPUs, func(c cpuPerOp) float64 { return c.self }).self}
		setCPU = cpuPerOp{redis: medianBy(setCPUs, redisOf).redis}
	}
	b.ReportMetric(floor.perSec, "floor-requests/s")
	b.ReportMetric(floor.p50us, "floor-p50-µs")
	b.ReportMetric(floor.p99us, "floor-p99-µs")
	b.ReportMetric(res64.perSec, "creates-64conns/s")
	b.ReportMetric(res.perSec, "creates/s")
	b.ReportMetric(res.p50us, "p50-µs")
	b.ReportMetric(res.p99us, "p99-µs")
	b.ReportMetric(ratio, "ratio-median")
	b.ReportMetric(sets.RPS, "redis-sets/s")
	b.ReportMetric(sets.P50ms*1000, "redis-set-p50-µs")
	b.ReportMetric(sets.P99ms*1000, "redis-set-p99-µs")
	b.ReportMetric(createCPU.redis, "redis-cpu-per-create-µs")
	b.ReportMetric(createCPU.self, "gateway-cpu-per-create-µs")
	b.ReportMetric(setCPU.redis, "redis-cpu-per-set-µs")
	b.ReportMetric(floorCPU.self, "floor-cpu-per-request-µs")
}

// medianBy answers the item of items whose key is the median's (of an even count, the
// lower middle one's): a run's figures kept together; items must not be empty.
func medianBy[T any](items []T, key func(T) float64) T {
	s := slices.Clone(items)
	slices.SortFunc(s, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return s[(len(s)-1)/2]
}

// cpuPerOp is the CPU (µs) that redis-server and this process (the gateway's) spent per
// operation over a load: what the machine's speed and the load beside it disturb much less
// than a rate, so that a change to a create's cost shows between two runs of a busy machine.
type cpuPerOp struct {
	redis, self   float64
	redis0, self0 time.Duration
}

func (c *cpuPerOp) start(b *testing.B, rdb *redis.Client) {
	if err := rdb.ConfigResetStat(b.Context()).Err(); err != nil {
		b.Fatal(err)
	}
	c.redis0, c.self0 = redisCPU(b, rdb), processCPU(b)
}

// end sets c's figures for n operations since start.
func (c *cpuPerOp) end(b *testing.B, rdb *redis.Client, n int64) {
	if n <= 0 {
		return
	}
	c.redis = float64((redisCPU(b, rdb) - c.redis0).Microseconds()) / float64(n)
	c.self = float64((processCPU(b) - c.self0).Microseconds()) / float64(n)
	info, err := rdb.Info(b.Context(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var lines []string
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, ok2 := strings.CutPrefix(name, "cmdstat_")
		if !ok || !ok2 {
			continue
		}
		var calls, usec int64
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		lines = append(lines, fmt.Sprintf("%s %.2f calls %.1f µs", name, float64(calls)/float64(n), float64(usec)/float64(n)))
	}
	b.Logf("redis per operation (%d): %s", n, strings.Join(lines, "; "))
}

// redisCPU is the CPU redis-server has used (INFO cpu: used_cpu_sys + used_cpu_user).
func redisCPU(b *testing.B, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(b.Context(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("INFO cpu %q: %v", line, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// processCPU is the CPU this process has used, every thread's (user and system).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// floorServer serves BenchmarkCreateSaturated's floor: POST /v1/sessions reads the body,
// SETs it in rdb under a key of its own and answers 201 with what the gateway at url answered
// a create of key (its Content-Type and body), on an httptest server as the gateway's.
func floorServer(b *testing.B, rdb *redis.Client, url, key string) string {
	resp, err := http.DefaultClient.Do(createRequest(url, key))
	if err != nil {
		b.Fatal(err)
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		b.Fatalf("a create for the floor's answer: %s, %v: %s", resp.Status, err, answer)
	}
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err == nil {
			err = rdb.Set(r.Context(), "floor:"+strconv.FormatInt(n.Add(1), 10), body, time.Minute).Err()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answer)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// setBaseline is redis-benchmark's SET from 16 clients, 100,000 requests, against addr.
func setBaseline(b *testing.B, addr string) redistest.SetBenchmark {
	r, err := redistest.RunSetBenchmark(b.Context(), addr, 16, 100000)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// BenchmarkCreateHalfSaturated: the latency target is "at half of saturation": wrk
// finds the saturated rate (3 s), then creates arrive open loop at half of it for 5 s, from
// a process of their own (this test binary again, TestOpenLoopClient), each measured from
// when it was sent; late-p99 is how late the client sent them (openLoopResult).
//
// Its baselines, in the same run, are the stack's floor (floorServer) measured the same way:
// at half of its own saturated rate (floor-half-…), and at the creates' rate (floor-same-…).
func BenchmarkCreateHalfSaturated(b *testing.B) {
	url, key, rdb := wrkServer(b)
	floorURL := floorServer(b, rdb, url, key)
	var creates, floorHalf, floorSame halfLoad
	for b.Loop() {
		creates = atHalfSaturation(b, url, newKey(b, rdb), newKey(b, rdb))
		floorHalf = atHalfSaturation(b, floorURL, key, key)
		floorSame = openLoopAt(b, floorURL, key, creates.rate)
	}
	b.ReportMetric(creates.rate, "creates/s")
	b.ReportMetric(creates.p50, "p50-µs")
	b.ReportMetric(creates.p99, "p99-µs")
	b.ReportMetric(creates.p99/creates.p50, "p99/p50")
	b.ReportMetric(creates.late, "late-p99-µs")
	for _, f := range []struct {
		name string
		h    halfLoad
	}{{"floor-half-", floorHalf}, {"floor-same-", floorSame}} {
		b.ReportMetric(f.h.rate, f.name+"requests/s")
		b.ReportMetric(f.h.p50, f.name+"p50-µs")
		b.ReportMetric(f.h.p99, f.name+"p99-µs")
		b.ReportMetric(f.h.p99/f.h.p50, f.name+"p99/p50")
	}
}

// halfLoad is what TestOpenLoopClient saw of creates sent at rate a second (µs).
type halfLoad struct{ rate, p50, p99, late float64 }

// atHalfSaturation finds url's saturated rate of creates with wrk (3 s, with key), then sends
// creates at half of it (openLoopAt, with key2: a project of its own, as BenchmarkCreateSaturated's).
func atHalfSaturation(b *testing.B, url, key, key2 string) halfLoad {
	return openLoopAt(b, url, key2, saturate(b, url, key, 3*time.Second, 16).perSec/2)
}

// newKey is the key of a new project on the gateway's Redis rdb (benchProject).
func newKey(b *testing.B, rdb *redis.Client) string {
	key, _ := benchProject(b, store.New(rdb))
	return key
}

// openLoopAt sends creates to url open loop at rate a second for 5 s, from a process of its
// own (TestOpenLoopClient).
func openLoopAt(b *testing.B, url, key string, rate float64) halfLoad {
	h := halfLoad{rate: rate}
	cmd := exec.CommandContext(b.Context(), os.Args[0], "-test.run=^TestOpenLoopClient$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("WB_OPEN_LOOP=%s %s %.0f 5", url, key, h.rate))
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("the open-loop client: %v\n%s", err, out)
	}
	if _, err := fmt.Sscanf(lineAfter(string(out), "wb-open-loop "), "%g %g %g", &h.p50, &h.p99, &h.late); err != nil {
		b.Fatalf("the open-loop client's summary: %v\n%s", err, out)
	}
	return h
}

// TestOpenLoopClient is BenchmarkCreateHalfSaturated's client, in a process of its own: with
// WB_OPEN_LOOP="URL KEY RATE SECONDS" it sends creates at RATE per second for SECONDS
// (openLoop) and prints "wb-open-loop P50 P99 LATE_P99" in µs. Any failed create fails it.
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
	res, err := openLoop(url, key, rate, secs)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("wb-open-loop %d %d %d\n", quantile(res.answered, 0.5).Microseconds(),
		quantile(res.answered, 0.99).Microseconds(), quantile(res.late, 0.99).Microseconds())
}

// openLoop sends int(rate*secs) creates to url with key, create i due at start + i/rate
// whatever came before: each on an idle keep-alive connection (openLoopConn), or on a new
// one when all are busy, so that a slow answer never holds back the next create (no
// coordinated omission). It answers the first error (a create not answered 201 among them).
//
// It is lean, as wrk2 is, because it shares two CPUs with what it measures: Go's net/http
// client cost 106 µs of CPU a create here (as much as the gateway; wrk costs 23), this one
// 60-70.
func openLoop(url, key string, rate, secs float64) (openLoopResult, error) {
	addr, ok := strings.CutPrefix(url, "http://")
	if !ok {
		return openLoopResult{}, fmt.Errorf("URL %q: want http://HOST:PORT", url)
	}
	req := fmt.Appendf(nil, "POST /v1/sessions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, key, len(createBody), createBody)
	n := int(rate * secs)
	res := openLoopResult{answered: make([]time.Duration, n), late: make([]time.Duration, n)}
	idle := make(chan *openLoopConn, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	conns := 0
	start := time.Now()
	due := func(i int) time.Time { return start.Add(time.Duration(float64(i) / rate * float64(time.Second))) }
	for i := range n {
		time.Sleep(time.Until(due(i)))
		var c *openLoopConn
		select {
		case c = <-idle:
		default: // every connection is busy: a new one, as wrk2 would have had it open already
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- fmt.Errorf("create %d: %w", i, err)
				break
			}
			c = &openLoopConn{Conn: nc, r: bufio.NewReader(nc), due: make(chan int, 1)}
			defer nc.Close()
			conns++
			wg.Go(func() {
				for j := range c.due {
					sent := time.Now()
					if err := c.create(req); err != nil {
						errs <- fmt.Errorf("create %d: %w", j, err)
					}
					res.answered[j], res.late[j] = time.Since(sent), sent.Sub(due(j))
					idle <- c
				}
			})
		}
		if c == nil {
			break
		}
		c.due <- i
	}
	// Each connection is idle again once its last create is answered.
	for range conns {
		close((<-idle).due)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return openLoopResult{}, fmt.Errorf("a create failed (of %d): %w", n, err)
	}
	slices.Sort(res.answered)
	slices.Sort(res.late)
	return res, nil
}

// openLoopResult is what openLoop saw of each create, sorted: answered is from when it was
// sent to its answer, the API's latency; late is from when it was due to when it was sent,
// the client's own (its timers wake up to a millisecond late, the more so on an idle
// machine, and it shares the CPUs with the server).
type openLoopResult struct{ answered, late []time.Duration }

// quantile answers the q-quantile (0 ≤ q ≤ 1) of sorted durations d.
func quantile(d []time.Duration, q float64) time.Duration { return d[int(float64(len(d)-1)*q)] }

// openLoopConn is one of TestOpenLoopClient's keep-alive connections: it sends the create
// for each index on due, one at a time, and reads its answer.
type openLoopConn struct {
	net.Conn
	r   *bufio.Reader
	due chan int
}

func (c *openLoopConn) create(req []byte) error {
	if _, err := c.Write(req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusCreated {
		err = fmt.Errorf("answered %s", resp.Status)
	}
	return err
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

// wrkServer is benchServer for a load from wrk, on a redis-server of its own (rdb).
func wrkServer(b *testing.B) (url, key string, rdb *redis.Client) {
	if _, err := exec.LookPath("wrk"); err != nil {
		b.Fatalf("wrk (Debian package wrk) is not installed: %v", err)
	}
	rdb = redistest.Server(b)
	url, key, _ = benchServerOn(b, rdb)
	return url, key, rdb
}

// saturate runs wrk's creates from conns connections for d.
func saturate(b *testing.B, url, key string, d time.Duration, conns int) wrkResult {
	script := filepath.Join(b.TempDir(), "create.lua")
	if err := os.WriteFile(script, []byte(wrkCreateScript(key)), 0o600); err != nil {
		b.Fatal(err)
	}
	out, err := exec.CommandContext(b.Context(), "wrk", "-t2", "-c"+strconv.Itoa(conns), "-d"+d.String(), "-s", script, url+"/v1/sessions").CombinedOutput()
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

// TestOpenLoop: openLoop sends rate×secs creates, with the key, on keep-alive connections,
// and answers each one's latency and lateness; a create not answered 201 fails it.
func TestOpenLoop(t *testing.T) {
	var creates, dials atomic.Int64
	var failAt atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != "POST" || r.URL.Path != "/v1/sessions" || r.Header.Get("Authorization") != "Bearer k1" || !bytes.Equal(body, createBody) {
			http.Error(w, "not a create", http.StatusBadRequest)
			return
		}
		if creates.Add(1) == failAt.Load() {
			http.Error(w, "refused", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"sess_1"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	res, err := openLoop(srv.URL, "k1", 500, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range [][]time.Duration{res.answered, res.late} {
		if len(d) != 100 || !slices.IsSorted(d) || d[0] < 0 {
			t.Errorf("%d durations (sorted: %v, least %v); want 100, sorted, none negative", len(d), slices.IsSorted(d), d[0])
		}
	}
	if creates.Load() != 100 {
		t.Errorf("%d creates; want 100", creates.Load())
	}
	// Without keep-alive, one a create. With it, as many as creates in flight at once: a
	// loaded machine (load 10–15) had 18 open for 100.
	if d := dials.Load(); d > 50 {
		t.Errorf("%d connections for 100 creates 2 ms apart: want them kept alive", d)
	}

	creates.Store(0)
	failAt.Store(10)
	if _, err := openLoop(srv.URL, "k1", 500, 0.2); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("with create 10 answered 500: %v; want its error", err)
	}
}
