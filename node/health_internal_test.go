package node

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
)

// TestWaitHealthySlowAgent: an agent that takes longer than a probe's first bound to answer
// is still found healthy. A fixed one-second bound cancelled every probe of such an agent, and
// the guest's start waited until its deadline failed it (seen on a loaded CI host, on runsc).
func TestWaitHealthySlowAgent(t *testing.T) {
	const delay = 1500 * time.Millisecond
	var probes atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/health" {
			http.NotFound(w, r)
			return
		}
		probes.Add(1)
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true,"pid":1}`))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c := agent.NewDialClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := waitHealthy(ctx, c); err != nil {
		t.Fatalf("after %s and %d probes: %v", time.Since(start).Round(time.Millisecond), probes.Load(), err)
	}
	t.Logf("healthy after %s, %d probes", time.Since(start).Round(time.Millisecond), probes.Load())
}
