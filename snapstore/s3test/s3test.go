// Package s3test serves an S3-compatible bucket on 127.0.0.1 for tests: gofakes3, a real
// S3 protocol implementation (signatures, multipart uploads, listings) in process.
package s3test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"wb/snapstore"
)

// Server is one S3 server with one bucket.
type Server struct {
	URL    string // the endpoint, http://127.0.0.1:PORT
	Bucket string
	// failPuts makes every upload answer 503 while set.
	failPuts atomic.Bool
}

// Start serves bucket "snapshots" until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	backend := s3mem.New()
	s := &Server{Bucket: "snapshots"}
	if err := backend.CreateBucket(s.Bucket); err != nil {
		t.Fatal(err)
	}
	h := gofakes3.New(backend).Server()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && s.failPuts.Load() {
			http.Error(w, "uploads refused by the test", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// StoreURL answers the --snapshot-store URL of the bucket.
func (s *Server) StoreURL() string {
	return "s3://" + s.Bucket + "?endpoint=" + s.URL + "&region=us-east-1"
}

// Env answers the AWS credential variables for Open (any non-empty pair: the fake checks no
// signatures).
func Env(name string) string {
	return map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test-secret"}[name]
}

// Open opens a store on the bucket.
func (s *Server) Open(t testing.TB) *snapstore.Store {
	t.Helper()
	st, err := snapstore.Open(context.Background(), s.StoreURL(), Env)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// FailPuts makes uploads fail (true) or work again (false).
func (s *Server) FailPuts(fail bool) { s.failPuts.Store(fail) }
