package conformance

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/store"
)

// BenchmarkIdleCPU measures what an idle control plane costs: `wb serve --runtime none` on a
// real redis-server holding N projects, nothing happening, the CPU of wb and of Redis over a
// window, in % of one core. N=1 is the baseline measured in the same run. WB_IDLE_PROJECTS
// changes the large N (10000).
func BenchmarkIdleCPU(b *testing.B) {
	if binPath == "" {
		b.Skip("an external deployment: the idle figure needs a wb serve started here")
	}
	large := 10000
	if v, err := strconv.Atoi(os.Getenv("WB_IDLE_PROJECTS")); err == nil && v > 0 {
		large = v
	}
	for _, n := range []int{1, large} {
		b.Run(fmt.Sprintf("projects=%d", n), func(b *testing.B) {
			rp := redistest.StartProc(b)
			rdb := redis.NewClient(&redis.Options{Addr: rp.Addr()})
			defer rdb.Close()
			start := time.Now()
			if err := createProjects(context.Background(), store.New(rdb), n); err != nil {
				b.Fatal(err)
			}
			b.Logf("%d projects written to Redis in %v", n, time.Since(start).Round(time.Millisecond))
			d, err := startServer(binPath, "none", "--allow-private-webhooks=false", "--redis", "redis://"+rp.Addr())
			if err != nil {
				b.Fatal(err)
			}
			defer d.stop()
			time.Sleep(5 * time.Second) // let start-up work (consumer groups, first sweeps) drain
			const window = 20 * time.Second
			pids := map[string]int{"wb": d.cmd.Process.Pid, "redis": rp.Pid()}
			before := map[string]int64{}
			for name, pid := range pids {
				if before[name], err = cpuTicks(pid); err != nil {
					b.Fatal(err)
				}
			}
			time.Sleep(window)
			for name, pid := range pids {
				after, err := cpuTicks(pid)
				if err != nil {
					b.Fatal(err)
				}
				// USER_HZ is 100 on Linux: a tick is 10 ms.
				b.ReportMetric(float64(after-before[name])*float64(10*time.Millisecond)/float64(window)*100, name+"-cpu-%core")
			}
			for range b.N {
			}
		})
	}
}

// createProjects writes n projects straight into the store, 16 at a time: through the API,
// creating 10,000 takes longer than the idle platform can be measured.
func createProjects(ctx context.Context, st *store.Store, n int) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				if _, _, err := st.CreateProject(ctx, fmt.Sprintf("idle-%d", i)); err != nil {
					errs <- fmt.Errorf("create project %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// cpuTicks answers a process's user plus system CPU time in clock ticks (/proc/PID/stat).
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: fields start after its closing parenthesis.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return utime + stime, nil
}
