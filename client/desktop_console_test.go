package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestDesktopScreenAndHeartbeat: GetDesktopScreen reads the PNG's bytes (and a 409 as an
// *Error); HeartbeatDesktop posts {} to the heartbeat and reads the desktop.
func TestDesktopScreenAndHeartbeat(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake")
	var beats []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/desktops/desk_1/screen":
			if r.Header.Get("Accept") != "image/png" {
				t.Errorf("screen asked for %q", r.Header.Get("Accept"))
			}
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(png)
		case r.Method == http.MethodGet && r.URL.Path == "/v1/desktops/desk_2/screen":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(409)
			_, _ = io.WriteString(w, `{"error":{"type":"invalid_state","code":"invalid_state","message":"desktop desk_2 is asleep"}}`)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/desktops/desk_1/heartbeat":
			b, _ := io.ReadAll(r.Body)
			beats = append(beats, trimNewline(string(b)))
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"desk_1","object":"desktop","state":"running"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, err := New(srv.URL, "wb_test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := c.GetDesktopScreen(ctx, "desk_1")
	if err != nil || !bytes.Equal(got, png) {
		t.Fatalf("screen: %q, %v", got, err)
	}
	var apiErr *Error
	if _, err := c.GetDesktopScreen(ctx, "desk_2"); !errors.As(err, &apiErr) || apiErr.Status != 409 || apiErr.Message != "desktop desk_2 is asleep" {
		t.Fatalf("screen of an asleep desktop: %v", err)
	}
	d, err := c.HeartbeatDesktop(ctx, "desk_1")
	if err != nil || d.ID != "desk_1" || d.State != "running" {
		t.Fatalf("heartbeat: %+v, %v", d, err)
	}
	if len(beats) != 1 || beats[0] != "{}" {
		t.Fatalf("heartbeat bodies %q, want one {}", beats)
	}
}
