package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/internal/testwait"
)

// echoScript answers its key and argument, after counting the call in KEYS[2] when given;
// an argument "bad" is an error reply, and "slow" holds Redis half a second.
var echoScript = redis.NewScript(`
if KEYS[2] then redis.call('INCR', KEYS[2]) end
if ARGV[1] == 'bad' then return redis.error_reply('bad argument') end
if ARGV[1] == 'slow' then
  local t0 = redis.call('TIME')
  repeat local t = redis.call('TIME') until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) >= 500000
end
return {KEYS[1], ARGV[1]}
`)

// TestSharedTripsAnswerEachCall: under load, calls share round trips (fewer than the calls),
// and each gets its own answer, or its own error; a lone call is one round trip of its own
// that is not made to wait, and nothing is left waiting or sending after.
func TestSharedTripsAnswerEachCall(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	if err := echoScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	trips := newSharedTrips(rdb, echoScript)
	rt := redistest.CountRoundTrips(rdb)
	if res, err := trips.run(ctx, []string{"k"}, "alone"); err != nil || strings.Join(res, " ") != "k alone" {
		t.Fatalf("a lone call: %q, %v", res, err)
	}
	if n := rt.Load(); n != 1 {
		t.Fatalf("a lone call took %d round trips", n)
	}

	const workers, calls = 32, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				arg := fmt.Sprintf("w%d-%d", w, i)
				if i%7 == 3 {
					arg = "bad"
				}
				key := fmt.Sprintf("key%d", w)
				res, err := trips.run(ctx, []string{key}, arg)
				switch {
				case arg == "bad" && (err == nil || !strings.Contains(err.Error(), "bad argument")):
					t.Errorf("a call answered with an error: %q, %v", res, err)
				case arg != "bad" && (err != nil || strings.Join(res, " ") != key+" "+arg):
					t.Errorf("call %s %s: %q, %v", key, arg, res, err)
				}
			}
		})
	}
	wg.Wait()
	if n := rt.Load() - 1; n >= workers*calls {
		t.Errorf("%d calls took %d round trips: none shared", workers*calls, n)
	} else {
		t.Logf("%d calls in %d round trips", workers*calls, n)
	}
	// A sender leaves after it has answered its last batch: its callers may return first.
	testwait.For(t, 10*time.Second, "the senders to leave once every call is answered", func() bool {
		trips.mu.Lock()
		defer trips.mu.Unlock()
		return trips.senders == 0 && len(trips.waiting) == 0
	})
}

// TestSharedTripsReloadScript: calls that share a round trip after Redis lost its scripts
// (SCRIPT FLUSH, as after a restart) load it again and succeed.
func TestSharedTripsReloadScript(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	trips := newSharedTrips(rdb, echoScript)
	for round := range 3 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				arg := fmt.Sprintf("r%d-%d", round, w)
				if res, err := trips.run(ctx, []string{"k"}, arg); err != nil || strings.Join(res, " ") != "k "+arg {
					t.Errorf("%s: %q, %v", arg, res, err)
				}
			})
		}
		wg.Wait()
	}
}

// TestSharedTripsCallGivesUp: a call waiting for a round trip (both in flight hold Redis
// for half a second each) whose context ends answers its error and never runs.
func TestSharedTripsCallGivesUp(t *testing.T) {
	rdb := redistest.Server(t)
	ctx := context.Background()
	if err := echoScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	trips := newSharedTrips(rdb, echoScript)
	var wg sync.WaitGroup
	for range maxTripsInFlight {
		wg.Go(func() {
			if _, err := trips.run(ctx, []string{"k", "count:slow"}, "slow"); err != nil {
				t.Error(err)
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		trips.mu.Lock()
		busy := trips.senders == maxTripsInFlight && len(trips.waiting) == 0
		trips.mu.Unlock()
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow calls did not both go out")
		}
		time.Sleep(time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := trips.run(cctx, []string{"k", "count:gave-up"}, "late"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the call that gave up: %v", err)
	}
	wg.Wait()
	if n, err := rdb.Get(ctx, "count:gave-up").Int(); !errors.Is(err, redis.Nil) {
		t.Errorf("the call that gave up ran %d times (%v)", n, err)
	}
	if n, _ := rdb.Get(ctx, "count:slow").Int(); n != maxTripsInFlight {
		t.Errorf("the slow calls ran %d times, want %d", n, maxTripsInFlight)
	}
}
