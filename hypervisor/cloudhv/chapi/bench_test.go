package chapi

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
)

// benchVMM answers like the VMM with as little work as possible, so the figures are the
// client's own cost (plus the Unix-socket round trip, which BenchmarkBaselineRawPut
// shows alone).
func benchVMM(b *testing.B) string {
	b.Helper()
	return listenUnix(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/api/v1/vmm.ping":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"version":"v54.0","pid":4242}`)
		case "/api/v1/vm.info":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"config":{"payload":{"kernel":"/k"}},"state":"Running"}`)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
}

func benchCall(b *testing.B, call func(*Client, context.Context) error) {
	c := New(benchVMM(b))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := call(c, ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkClientPause(b *testing.B) {
	benchCall(b, func(c *Client, ctx context.Context) error { return c.PauseVM(ctx) })
}

func BenchmarkClientResize(b *testing.B) {
	benchCall(b, func(c *Client, ctx context.Context) error {
		return c.ResizeVM(ctx, VmResize{DesiredVcpus: 2, DesiredRam: 1 << 30})
	})
}

func BenchmarkClientCreate(b *testing.B) {
	benchCall(b, func(c *Client, ctx context.Context) error { return c.CreateVM(ctx, wbVmConfig) })
}

func BenchmarkClientPing(b *testing.B) {
	benchCall(b, func(c *Client, ctx context.Context) error { _, err := c.Ping(ctx); return err })
}

func BenchmarkClientInfo(b *testing.B) {
	benchCall(b, func(c *Client, ctx context.Context) error { _, err := c.VMInfo(ctx); return err })
}

// BenchmarkBaselineRawPut is the same exchange as BenchmarkClientPause written by hand on
// a fresh connection each time: the floor the client's figures compare to.
func BenchmarkBaselineRawPut(b *testing.B) {
	path := benchVMM(b)
	req := "PUT /api/v1/vm.pause HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
	b.ReportAllocs()
	for b.Loop() {
		conn, err := net.Dial("unix", path)
		if err != nil {
			b.Fatal(err)
		}
		io.WriteString(conn, req)
		resp, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || !strings.HasPrefix(string(resp), "HTTP/1.1 204") {
			b.Fatalf("%q, %v", resp, err)
		}
	}
}

// BenchmarkEventDecoder decodes a session's worth of events (19 pretty objects).
func BenchmarkEventDecoder(b *testing.B) {
	data, err := os.ReadFile("testdata/lifecycle.events")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var r strings.Reader
	for b.Loop() {
		r.Reset(string(data))
		d := NewEventDecoder(&r)
		for {
			if _, err := d.Next(); err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
		}
	}
}
