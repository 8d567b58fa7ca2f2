package policies

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// hostileDir holds tenant policies that attack the host running them; the conformance suite
// puts them through the gateway too. Each file says what it attacks ("# attacks:") and what
// must happen ("# expect: compile_error" or "# expect: deny").
const hostileDir = "testdata/hostile"

// HostileExpectation reads a hostile policy's "# expect:" line.
func hostileExpectation(src string) string {
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# expect:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// memPeak samples the heap's live and unswept objects and the process's RSS every
// millisecond until stopped, and answers their peaks.
type memPeak struct {
	stop     chan struct{}
	done     sync.WaitGroup
	heap     uint64
	rss      uint64
	samples  []metrics.Sample
	baseHeap uint64
	baseRSS  uint64
}

func startMemPeak() *memPeak {
	runtime.GC()
	m := &memPeak{stop: make(chan struct{}), samples: []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}}
	m.baseHeap, m.baseRSS = m.sample()
	m.heap, m.rss = m.baseHeap, m.baseRSS
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
				h, r := m.sample()
				m.heap, m.rss = max(m.heap, h), max(m.rss, r)
			}
		}
	}()
	return m
}

func (m *memPeak) sample() (heap, rss uint64) {
	metrics.Read(m.samples)
	return m.samples[0].Value.Uint64(), vmRSS()
}

// end answers how much the heap and the RSS grew at their peaks.
func (m *memPeak) end() (heap, rss uint64) {
	close(m.stop)
	m.done.Wait()
	h, r := m.sample()
	m.heap, m.rss = max(m.heap, h), max(m.rss, r)
	return m.heap - m.baseHeap, m.rss - m.baseRSS
}

func vmRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestHostilePolicies: every policy of testdata/hostile is refused at upload with a compile
// error that names the builtin, or, evaluated for a create in this process, answers within
// the deadline with a fail-closed deny while the heap and the RSS grow by less than 256 MiB.
func TestHostilePolicies(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(hostileDir, "*.rego"))
	if err != nil || len(files) < 10 {
		t.Fatalf("hostile policies: %v (%v), want at least 10", files, err)
	}
	ctx := context.Background()
	e := newEngine(t, nil, Options{})
	const limit = 256 << 20
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".rego")
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		project := "proj_hostile_" + strings.ReplaceAll(name, "-", "_")
		switch want := hostileExpectation(src); want {
		case "compile_error":
			_, err := e.Put(ctx, project, "hostile", src, ModeEnforce)
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Errorf("%s: upload answered %v, want a compile error", name, err)
				continue
			}
			t.Logf("%-22s refused at upload: %v", name, err)
		case "deny":
			if _, err := e.Put(ctx, project, "hostile", src, ModeEnforce); err != nil {
				t.Errorf("%s: upload: %v", name, err)
				continue
			}
			if _, err := e.Admit(ctx, admission("proj_warmup", 2, nil)); err != nil { // loads nothing heavy
				t.Fatal(err)
			}
			m := startMemPeak()
			start := time.Now()
			d, err := e.Admit(ctx, admission(project, 2, nil))
			took := time.Since(start)
			heap, rss := m.end()
			if err != nil {
				t.Errorf("%s: Admit: %v", name, err)
				continue
			}
			if d.Allow || len(d.Reasons) != 1 {
				t.Errorf("%s: %+v, want a deny", name, d)
			}
			if took > 5*time.Second {
				t.Errorf("%s: answered after %v, want within the deadline", name, took)
			}
			if heap >= limit || rss >= limit {
				t.Errorf("%s: the heap grew by %s and the RSS by %s, want less than 256 MiB each", name, bytesText(int64(heap)), bytesText(int64(rss)))
			}
			reason := ""
			if len(d.Reasons) > 0 {
				reason = d.Reasons[0]
			}
			t.Logf("%-22s denied in %6.1f ms, heap +%9s, RSS +%9s: %.160s", name, float64(took.Microseconds())/1000,
				bytesText(int64(heap)), bytesText(int64(rss)), reason)
		default:
			t.Errorf("%s: no \"# expect: compile_error|deny\" line", name)
		}
	}
}

// TestHostileConcurrent: many creates at once against one project's memory-hungry policy
// evaluate a few at a time, so the heap stays within a few evaluation budgets; all fail
// closed.
func TestHostileConcurrent(t *testing.T) {
	ctx := context.Background()
	e := newEngine(t, nil, Options{EvalTimeout: time.Second})
	src, err := os.ReadFile(filepath.Join(hostileDir, "concat_doubling.rego"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Put(ctx, "proj_hostile_many", "hostile", string(src), ModeEnforce); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Admit(ctx, admission("proj_hostile_many", 2, nil)); err != nil { // loads the set
		t.Fatal(err)
	}
	const n = 24
	m := startMemPeak()
	var wg sync.WaitGroup
	decisions := make(chan bool, n)
	for range n {
		wg.Go(func() {
			d, err := e.Admit(ctx, admission("proj_hostile_many", 2, nil))
			decisions <- err == nil && !d.Allow
		})
	}
	wg.Wait()
	heap, rss := m.end()
	close(decisions)
	for denied := range decisions {
		if !denied {
			t.Error("a create was not denied")
		}
	}
	if heap >= 256<<20 {
		t.Errorf("%d concurrent creates grew the heap by %s (RSS %s), want less than 256 MiB", n, bytesText(int64(heap)), bytesText(int64(rss)))
	}
	t.Logf("%d concurrent creates: heap +%s, RSS +%s", n, bytesText(int64(heap)), bytesText(int64(rss)))
}
