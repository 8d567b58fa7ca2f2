package node

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"wb/node/nodeapi"
)

// TestWindDown: windDown waits for the background work running, while requests go on
// starting more (as the node's API does while its server shuts down: under -race, a
// WaitGroup's Add racing its Wait fails the test); once it has returned, nothing starts,
// and a provision answers 503.
func TestWindDown(t *testing.T) {
	n := &Node{}
	started, release := make(chan struct{}), make(chan struct{})
	if !n.goBackground(func() { close(started); <-release }) {
		t.Fatal("goBackground refused work before the node wound down")
	}
	<-started

	var ran, after atomic.Int64
	var wound atomic.Bool
	stop := make(chan struct{})
	var callers sync.WaitGroup
	for range 4 {
		callers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				woundBefore := wound.Load()
				if n.goBackground(func() { ran.Add(1) }) && woundBefore {
					after.Add(1)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { n.windDown(); wound.Store(true); close(done) }()
	select {
	case <-done:
		t.Fatal("windDown returned while background work still ran")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-done
	time.Sleep(10 * time.Millisecond) // the callers go on after the wind-down
	close(stop)
	callers.Wait()
	if after.Load() != 0 {
		t.Fatalf("%d calls started background work after windDown returned", after.Load())
	}
	if n.goBackground(func() { t.Error("work ran after windDown") }) {
		t.Fatal("goBackground answered true after windDown")
	}
	t.Logf("%d background calls ran before the wind-down", ran.Load())

	rec := httptest.NewRecorder()
	n.apiProvision(rec, httptest.NewRequest("POST", nodeapi.PathProvision, strings.NewReader(`{"id":"sess_0123456789abcdefgh","template":"tpl_base"}`)))
	var body nodeapi.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != 503 || body.Error == nil || body.Error.Code != nodeapi.CodeUnavailable {
		t.Fatalf("a provision after the wind-down answered %d %s, want 503 %s", rec.Code, rec.Body, nodeapi.CodeUnavailable)
	}
}
