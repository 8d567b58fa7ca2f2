package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestDesktopCalls: each desktop call sends the document's method, path and body, and reads
// the answer into a Desktop (the drift test holds the shapes; this holds the routes).
func TestDesktopCalls(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/desktops":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"desk_1","state":"asleep"}],"next_cursor":null}`)
		case r.Method == http.MethodDelete:
			_, _ = io.WriteString(w, `{"id":"desk_1","object":"desktop","deleted":true}`)
		default:
			_ = json.NewEncoder(w).Encode(map[string]any{"id": "desk_1", "object": "desktop", "state": "starting", "size": "m"})
		}
	}))
	defer srv.Close()
	c, err := New(srv.URL, "wb_test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := c.CreateDesktop(ctx, CreateDesktopRequest{Name: "desk", Size: "m"})
	if err != nil || d.ID != "desk_1" || d.State != "starting" || d.Size != "m" {
		t.Fatalf("create: %+v, %v", d, err)
	}
	l, err := c.ListDesktops(ctx, Page{Limit: 5})
	if err != nil || len(l.Data) != 1 || l.Data[0].State != "asleep" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	for _, call := range []func() (*Desktop, error){
		func() (*Desktop, error) { return c.GetDesktop(ctx, "desk_1") },
		func() (*Desktop, error) { return c.ResizeDesktop(ctx, "desk_1", ResizeDesktopRequest{Size: "l"}) },
		func() (*Desktop, error) { return c.SleepDesktop(ctx, "desk_1") },
		func() (*Desktop, error) { return c.WakeDesktop(ctx, "desk_1") },
		func() (*Desktop, error) { return c.StopDesktop(ctx, "desk_1") },
		func() (*Desktop, error) { return c.StartDesktop(ctx, "desk_1") },
	} {
		if d, err := call(); err != nil || d.ID != "desk_1" {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	if del, err := c.DeleteDesktop(ctx, "desk_1"); err != nil || !del.Deleted {
		t.Fatalf("delete: %+v, %v", del, err)
	}
	want := []string{
		`POST /v1/desktops? {"name":"desk","size":"m"}`,
		`GET /v1/desktops?limit=5 `,
		`GET /v1/desktops/desk_1? `,
		`PATCH /v1/desktops/desk_1? {"size":"l"}`,
		`POST /v1/desktops/desk_1:sleep? {}`,
		`POST /v1/desktops/desk_1:wake? {}`,
		`POST /v1/desktops/desk_1:stop? {}`,
		`POST /v1/desktops/desk_1:start? {}`,
		`DELETE /v1/desktops/desk_1? `,
	}
	for i := range got {
		got[i] = trimNewline(got[i])
	}
	if !slices.Equal(got, want) {
		t.Fatalf("requests:\n%q\nwant:\n%q", got, want)
	}
}

func trimNewline(s string) string {
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	return s
}

// TestDesktopFileCallsAndMCPClient: the desktop file calls use the desktop's files route, and
// MCPHTTPClient sends the API key on any request (an MCP client's POSTs to mcp_url).
func TestDesktopFileCallsAndMCPClient(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+string(b)+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		switch {
		case r.Method == http.MethodGet && r.URL.Query().Get("list") == "1":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"name":"a.txt","size":3,"mode":"0644","is_dir":false,"mod_time":"2025-01-02T03:04:05Z"}],"next_cursor":null}`)
		case r.Method == http.MethodGet:
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = io.WriteString(w, "one")
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	c, err := New(srv.URL, "wb_test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.UploadDesktopFile(ctx, "desk_1", "a.txt", strings.NewReader("one")); err != nil {
		t.Fatal(err)
	}
	if b, err := c.DownloadDesktopFile(ctx, "desk_1", "a.txt"); err != nil || string(b) != "one" {
		t.Fatalf("download: %q, %v", b, err)
	}
	if l, err := c.ListDesktopFiles(ctx, "desk_1", "."); err != nil || len(l.Data) != 1 || l.Data[0].Name != "a.txt" {
		t.Fatalf("list: %+v, %v", l, err)
	}
	if err := c.DeleteDesktopFile(ctx, "desk_1", "a.txt"); err != nil {
		t.Fatal(err)
	}
	resp, err := c.MCPHTTPClient().Post(srv.URL+"/v1/desktops/desk_1/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := []string{
		`PUT /v1/desktops/desk_1/files?path=a.txt one Bearer wb_test`,
		`GET /v1/desktops/desk_1/files?path=a.txt  Bearer wb_test`,
		`GET /v1/desktops/desk_1/files?list=1&path=.  Bearer wb_test`,
		`DELETE /v1/desktops/desk_1/files?path=a.txt  Bearer wb_test`,
		`POST /v1/desktops/desk_1/mcp? {} Bearer wb_test`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("requests:\n%q\nwant:\n%q", got, want)
	}
}
