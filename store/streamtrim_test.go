package store

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
)

// trimScript trims a stream with StreamTrimLua and answers its length. KEYS: stream.
var trimScript = redis.NewScript(StreamTrimLua + `
trim(KEYS[1])
return redis.call('XLEN', KEYS[1])
`)

// TestStreamTrimLua: trim removes only what every consumer group has acknowledged: a stream
// without groups is left whole, and an entry delivered and not acknowledged stays, with all
// that follows it.
func TestStreamTrimLua(t *testing.T) {
	for _, b := range redistest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.New(t)
			const stream = "trim:stream"
			trim := func(want int64) {
				t.Helper()
				if n, err := trimScript.Run(ctx, rdb, []string{stream}).Int64(); err != nil || n != want {
					t.Fatalf("after trim: %d entries (%v), want %d", n, err, want)
				}
			}
			trim(0) // no stream: nothing to do, no error
			ids := make([]string, 4)
			for i := range ids {
				var err error
				if ids[i], err = rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"i", i}}).Result(); err != nil {
					t.Fatal(err)
				}
			}
			trim(4) // no group yet
			for _, g := range []string{"g1", "g2"} {
				if err := rdb.XGroupCreate(ctx, stream, g, "0").Err(); err != nil {
					t.Fatal(err)
				}
			}
			trim(4) // nothing delivered
			read := func(group string, n int64) {
				t.Helper()
				if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{stream, ">"},
					Count: n, Block: -1}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			ack := func(group string, ids ...string) {
				t.Helper()
				if err := rdb.XAck(ctx, stream, group, ids...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			read("g1", 2)
			ack("g1", ids[0])
			read("g2", 3)
			ack("g2", ids[:3]...)
			trim(3) // g1, furthest behind, still holds the second pending
			ack("g1", ids[1])
			trim(2) // g1 has delivered and acknowledged two
			read("g1", 2)
			ack("g1", ids[2:]...)
			trim(1) // g2 has not read the last
			read("g2", 1)
			ack("g2", ids[3])
			trim(0)
		})
	}
}
