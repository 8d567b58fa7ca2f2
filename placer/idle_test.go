package placer

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/internal/testwait"
	"wb/quota"
	"wb/store"
)

// commandsServed answers how many commands the server has executed, from INFO
// commandstats, less the INFO calls themselves.
func commandsServed(t *testing.T, rdb redis.UniversalClient) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text() // cmdstat_get:calls=5,usec=…
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, _ := strconv.ParseInt(calls, 10, 64)
		total += n
	}
	return total
}

// TestIdleCostsNothing: a placer and a settler with 1,000 idle projects, past their start
// sweeps, send Redis (nearly) nothing: the cost of an idle platform does not grow with its
// projects.
func TestIdleCostsNothing(t *testing.T) {
	rdb := redistest.Server(t)
	st := store.New(rdb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const projects = 1000
	for i := range projects {
		if _, err := st.EnsureProject(ctx, fmt.Sprintf("proj_%04d", i), "idle"); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Heartbeat(ctx, store.NodeInfo{ID: "n_1", Region: "r1", Tiers: []int{1}, VCPU: 4, MemoryMiB: 4096}); err != nil {
		t.Fatal(err)
	}
	pl := New(Config{Store: st, Provisioner: &recorder{placed: map[string]string{}}, HeartbeatTimeout: time.Hour})
	settler := quota.NewSettler(rdb, quota.SettlerOptions{Consumer: "idle"})
	done := make(chan struct{}, 2)
	go func() { _ = pl.Run(ctx); done <- struct{}{} }()
	go func() { _ = settler.Run(ctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()
	// Both have swept once they read signals.
	testwait.For(t, time.Minute, "the start sweeps", func() bool {
		return hasGroup(rdb, "wb:signal:pending", "placer") && hasGroup(rdb, "wb:signal:usage", "settler")
	})
	before := commandsServed(t, rdb)
	const window = 3 * time.Second
	time.Sleep(window) // the measurement: what an idle window costs
	served := commandsServed(t, rdb) - before
	// Each wakes at most every few seconds, a handful of commands each time.
	if served > 30 {
		t.Fatalf("%d Redis commands in %v with %d idle projects, want almost none", served, window, projects)
	}
	t.Logf("%d Redis commands in %v with %d idle projects", served, window, projects)
}
