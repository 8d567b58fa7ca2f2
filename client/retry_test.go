package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// keyRecorder is a server that answers the first failures answers of each call with status
// (and Retry-After, when set), then 201 with a session; it records each request's
// Idempotency-Key and body.
type keyRecorder struct {
	mu         sync.Mutex
	keys       []string
	bodies     []string
	failures   int
	status     int
	retryAfter string
}

func (k *keyRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	k.mu.Lock()
	k.keys = append(k.keys, r.Header.Get("Idempotency-Key"))
	k.bodies = append(k.bodies, string(b))
	n := len(k.keys)
	k.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer key_test" {
		w.WriteHeader(401)
		return
	}
	if n <= k.failures {
		if k.retryAfter != "" {
			w.Header().Set("Retry-After", k.retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(k.status)
		fmt.Fprint(w, `{"error":{"type":"rate_limited","code":"rate_limited","message":"slow down"}}`)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(201)
	fmt.Fprint(w, `{"id":"sess_1","object":"session","tier":2,"state":"pending","created_at":"2026-01-01T00:00:00.000Z"}`)
}

func (k *keyRecorder) snapshot() ([]string, []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...), append([]string(nil), k.bodies...)
}

// TestRetryHonoursRetryAfterWithOneIdempotencyKey: a create answered 429 with Retry-After: 1
// is retried after that second (not the 1 ms backoff) with the same Idempotency-Key and body,
// and its 201 is the answer; the next create has a key of its own.
func TestRetryHonoursRetryAfterWithOneIdempotencyKey(t *testing.T) {
	rec := &keyRecorder{failures: 1, status: 429, retryAfter: "1"}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, err := New(srv.URL, "key_test", WithHTTPClient(srv.Client()), WithRetries(4, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	s, err := c.CreateSession(ctx, CreateSessionRequest{Tier: 2})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("the retry came %s after a 429 with Retry-After: 1; want about a second", took)
	}
	if s.ID != "sess_1" || s.State != "pending" {
		t.Errorf("answer %+v, want sess_1 pending", s)
	}
	keys, bodies := rec.snapshot()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] || bodies[0] != bodies[1] {
		t.Fatalf("attempts sent keys %q bodies %q; want two attempts with one non-empty key and one body", keys, bodies)
	}
	if _, err := c.CreateSession(ctx, CreateSessionRequest{Tier: 2}); err != nil {
		t.Fatal(err)
	}
	if keys, _ = rec.snapshot(); keys[2] == keys[0] {
		t.Errorf("a second create reused the first one's Idempotency-Key %q", keys[0])
	}
}

// TestRetry503AndBound: 503 is retried too, and at most the configured number of attempts;
// the last answer comes back as *Error with its fields.
func TestRetry503AndBound(t *testing.T) {
	rec := &keyRecorder{failures: 100, status: 503}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, err := New(srv.URL, "key_test", WithHTTPClient(srv.Client()), WithRetries(3, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = c.CreateSession(ctx, CreateSessionRequest{Tier: 2})
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Status != 503 || apiErr.Type != "rate_limited" || apiErr.Message != "slow down" {
		t.Fatalf("err %v, want *Error 503 rate_limited", err)
	}
	if keys, _ := rec.snapshot(); len(keys) != 3 {
		t.Errorf("%d attempts, want 3 (WithRetries(3, …))", len(keys))
	}
}

// TestRetryRespectsContext: a Retry-After longer than the context's deadline is not waited
// out; the call answers at once with the 429.
func TestRetryRespectsContext(t *testing.T) {
	rec := &keyRecorder{failures: 100, status: 429, retryAfter: "60"}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, err := New(srv.URL, "key_test", WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.GetSession(ctx, "sess_1")
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Status != 429 || apiErr.RetryAfter != time.Minute {
		t.Fatalf("err %v, want *Error 429 with RetryAfter 1m", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %s: waited for a Retry-After past the context's deadline", took)
	}
	if keys, _ := rec.snapshot(); len(keys) != 1 || keys[0] != "" {
		t.Errorf("keys %q: want one attempt, and no Idempotency-Key on a GET", keys)
	}
}

// TestErrorFromAnyBody: an error answer that is not the API's JSON still comes back as *Error
// with its status.
func TestErrorFromAnyBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad gateway from a proxy", 502)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "key_test", WithHTTPClient(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSession(context.Background(), "sess_1")
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Status != 502 || !strings.Contains(apiErr.Message, "bad gateway from a proxy") {
		t.Fatalf("err %v, want *Error 502 carrying the body", err)
	}
}

// TestNewChecksArguments: a base URL that is not absolute http(s), or an empty key, is refused.
func TestNewChecksArguments(t *testing.T) {
	for _, tc := range []struct{ url, key string }{{"wb.example.com", "k"}, {"ftp://x", "k"}, {"http://127.0.0.1:1", ""}} {
		if _, err := New(tc.url, tc.key); err == nil {
			t.Errorf("New(%q, %q) accepted", tc.url, tc.key)
		}
	}
}

// TestUploadRetryRewindsAndKeepsFile: an upload answered 503 is sent again from the start of
// a seekable body, and the caller's file is not closed by the transport.
func TestUploadRetryRewindsAndKeepsFile(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		n := len(bodies)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(204)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "key_test", WithHTTPClient(srv.Client()), WithRetries(2, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "upload")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.WriteString(f, "content"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if err := c.UploadFile(context.Background(), "sess_1", "/tmp/x", f); err != nil {
		t.Fatalf("upload: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || bodies[0] != "content" || bodies[1] != "content" {
		t.Errorf("bodies %q, want the whole content twice", bodies)
	}
	if _, err := f.Stat(); err != nil {
		t.Errorf("the caller's file after the upload: %v (closed by the transport?)", err)
	}
}
