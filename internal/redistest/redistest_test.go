package redistest

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestServer(t *testing.T) {
	c := Server(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v", got, err)
	}
	// No persistence configured.
	cfg, err := c.ConfigGet(ctx, "save").Result()
	if err != nil || cfg["save"] != "" {
		t.Fatalf("CONFIG GET save = %v, %v", cfg, err)
	}
}

func TestProcStopStart(t *testing.T) {
	p := StartProc(t)
	addr := p.Addr()
	if err := ping(addr); err != nil {
		t.Fatalf("ping after start: %v", err)
	}
	p.Stop()
	if err := ping(addr); err == nil {
		t.Fatal("ping succeeded after Stop")
	}
	p.Stop() // idempotent
	p.Start()
	if p.Addr() != addr {
		t.Fatalf("addr changed across restart: %s -> %s", addr, p.Addr())
	}
	c := newClient(t, addr)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
	p.Start() // no-op while running
}

func TestCluster(t *testing.T) {
	start := time.Now()
	cc := Cluster(t)
	t.Logf("cluster ready in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Hash-tagged keys; ensure all three slot ranges are hit.
	hit := map[int]bool{}
	var keys []string
	for i := 0; len(hit) < 3 && i < 100; i++ {
		k := fmt.Sprintf("{%c}key", 'a'+rune(i%26)) + fmt.Sprint(i/26)
		slot, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		for r, rg := range clusterRanges {
			if int(slot) >= rg[0] && int(slot) <= rg[1] {
				hit[r] = true
			}
		}
		keys = append(keys, k)
	}
	if len(hit) != 3 {
		t.Fatalf("keys %v only hit ranges %v", keys, hit)
	}
	for _, k := range keys {
		if err := cc.Set(ctx, k, "v:"+k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	for _, k := range keys {
		if got, err := cc.Get(ctx, k).Result(); err != nil || got != "v:"+k {
			t.Fatalf("GET %s = %q, %v", k, got, err)
		}
	}
	// Every master actually holds data.
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := c.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("master %s holds no keys", c.Options().Addr)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestMini(t *testing.T) {
	c, m := Mini(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get("k"); got != "v" {
		t.Fatalf("miniredis k = %q", got)
	}
	m.FastForward(2 * time.Minute)
	if n, _ := c.Exists(ctx, "k").Result(); n != 0 {
		t.Fatal("key did not expire")
	}
}

func TestBackends(t *testing.T) {
	for _, b := range Backends() {
		t.Run(b.Name, func(t *testing.T) {
			c := b.New(t)
			ctx := context.Background()
			if err := c.Set(ctx, "{x}k", b.Name, 0).Err(); err != nil {
				t.Fatal(err)
			}
			if got, err := c.Get(ctx, "{x}k").Result(); err != nil || got != b.Name {
				t.Fatalf("GET = %q, %v", got, err)
			}
		})
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("all", func(t *testing.T) {
		for _, b := range Backends() {
			c := b.New(t)
			if err := c.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		StartProc(t).Stop()
	})
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: before %d, after %d\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
