package redisconn_test

import (
	"context"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"wb/internal/redisconn"
	"wb/internal/redistest"
)

// TestDialerHidesTheDescriptor: go-redis peeks at a pooled connection's socket only through
// syscall.Conn, which a plain dial answers and the Dialer's connection does not.
func TestDialerHidesTheDescriptor(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	plain, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, ok := plain.(syscall.Conn); !ok {
		t.Fatalf("a plain TCP connection (%T) is no syscall.Conn: the test proves nothing", plain)
	}
	c, err := redisconn.Dialer(time.Second)(t.Context(), "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(syscall.Conn); ok {
		t.Errorf("the Dialer's connection (%T) is a syscall.Conn: go-redis would peek at it before every command", c)
	}
	if _, err := redisconn.Dialer(time.Second)(t.Context(), "tcp", "127.0.0.1:1"); err == nil {
		t.Error("a dial to a closed port succeeded")
	}
}

// TestClosedConnectionIsRedialled: with no peek, a pooled connection that the server closed
// is found by the next command, which go-redis runs again on a new connection, once: a
// script that counts its runs counts one.
func TestClosedConnectionIsRedialled(t *testing.T) {
	addr := redistest.ServerAddr(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: redisconn.Dialer(time.Second),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer rdb.Close()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx := context.Background()
	count := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := count.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	id, err := rdb.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n, err := admin.ClientKillByFilter(ctx, "ID", strconv.FormatInt(id, 10)).Result(); err != nil || n != 1 {
		t.Fatalf("CLIENT KILL ID %d = %d, %v", id, n, err)
	}
	for i := 1; i <= 2; i++ {
		n, err := count.Run(ctx, rdb, []string{"runs"}).Int()
		if err != nil || n != i {
			t.Fatalf("run %d after the server closed the connection: %d, %v; want %d", i, n, err, i)
		}
	}
	if id2, err := rdb.ClientID(ctx).Result(); err != nil || id2 == id {
		t.Errorf("client id after the kill = %d, %v; want a new connection's, not %d", id2, err, id)
	}
}
