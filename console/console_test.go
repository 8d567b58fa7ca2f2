package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"wb/console"
	"wb/desktop"
)

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	resp := rec.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestPages: the pages, scripts and styles are served under /console with a policy that
// lets them load only from the console itself; anything else is 404.
func TestPages(t *testing.T) {
	h := console.Handler()
	for path, want := range map[string]string{
		"/console/":             "text/html",
		"/console/desktop.html": "text/html",
		"/console/common.js":    "text/javascript",
		"/console/index.js":     "text/javascript",
		"/console/desktop.js":   "text/javascript",
		"/console/console.css":  "text/css",
	} {
		resp, _ := get(t, h, path)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), want) {
			t.Errorf("GET %s: %d %s, want 200 %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
		}
	}
	if resp, _ := get(t, h, "/console/nothing.html"); resp.StatusCode != 404 {
		t.Errorf("GET /console/nothing.html: %d", resp.StatusCode)
	}
}

// TestResizeOffersEverySize: the desktop page's size menu lists exactly desktop.Sizes().
func TestResizeOffersEverySize(t *testing.T) {
	_, page := get(t, console.Handler(), "/console/desktop.html")
	sel := regexp.MustCompile(`(?s)<select id="new-size">(.*?)</select>`).FindStringSubmatch(page)
	if sel == nil {
		t.Fatal("desktop.html has no size menu")
	}
	var got []desktop.Size
	for _, m := range regexp.MustCompile(`<option value="([^"]+)">`).FindAllStringSubmatch(sel[1], -1) {
		got = append(got, desktop.Size(m[1]))
	}
	if !slices.Equal(got, desktop.Sizes()) {
		t.Errorf("the size menu offers %v, desktop.Sizes() is %v", got, desktop.Sizes())
	}
}
