package suite

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"wb/client"
)

// TestFlatUsage: flatUsage passes a state whose usage stops growing (at once, or after a
// settler that was behind catches up), and fails one billed per second, even with a late
// flush in it. Each case reads session_s from a fake API, one value per read (6 s apart).
func TestFlatUsage(t *testing.T) {
	if testing.Short() {
		t.Skip("waits up to 30 s")
	}
	cases := []struct {
		name  string
		reads []int64
		pass  bool
	}{
		{"flat at once", []int64{5, 5}, true},
		{"the settler behind, then flat", []int64{3, 8, 8, 8}, true},
		{"billed per second", []int64{0, 6, 12, 18, 24}, false},
		{"billed per second, one flush late", []int64{0, 6, 6, 12, 18}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			next := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				if next >= len(tc.reads) {
					t.Errorf("read %d, past the case's %d", next+1, len(tc.reads))
					w.WriteHeader(500)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(map[string]any{"id": "sess_x", "object": "session", "state": "paused",
					"usage_to_date": map[string]any{"session_s": tc.reads[next]}})
				next++
			}))
			defer srv.Close()
			c, err := client.New(srv.URL, "sk_test")
			if err != nil {
				t.Fatal(err)
			}
			saw, err := (&Env{C: c}).flatUsage(context.Background(), "sess_x")
			if (err == nil) != tc.pass {
				t.Errorf("flatUsage: %s, %v; want pass %v", saw, err, tc.pass)
			}
			mu.Lock()
			defer mu.Unlock()
			if next != len(tc.reads) {
				t.Errorf("%d reads, want %d", next, len(tc.reads))
			}
			if !strings.Contains(saw, "paused") {
				t.Errorf("saw %q does not name the state", saw)
			}
		})
	}
}
