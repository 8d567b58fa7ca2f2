package chspec

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func exchange(method, path, reqBody string, status int, respBody string) (*http.Request, *http.Response) {
	r, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(reqBody))
	if reqBody != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	resp := &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(respBody))}
	if respBody != "" {
		resp.Header.Set("Content-Type", "application/json")
	}
	return r, resp
}

// TestChecker: the document's own shapes pass, the listed deviations pass, and anything
// else is named.
func TestChecker(t *testing.T) {
	c, err := NewChecker()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                  string
		method, path, req     string
		status                int
		resp                  string
		wantReqOK, wantRespOK bool
	}{
		{"ping", "GET", "/api/v1/vmm.ping", "", 200, `{"version":"v54.0","pid":12,"features":[]}`, true, true},
		{"create", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k","cmdline":"console=hvc0"}}`, 204, "", true, true},
		{"create without payload", "PUT", "/api/v1/vm.create", `{"cpus":{"boot_vcpus":1,"max_vcpus":1}}`, 204, "", false, true},
		{"create with a wrong type", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":7}}`, 204, "", false, true},
		{"pause in a wrong state: 500 and an error chain", "PUT", "/api/v1/vm.pause", "", 500, `["Error pausing VM","InvalidStateTransition(Created, Paused)"]`, true, true},
		{"an error body that is not a chain", "PUT", "/api/v1/vm.pause", "", 500, `{"error":"x"}`, true, false},
		{"405 is in the document but never sent", "PUT", "/api/v1/vm.pause", "", 405, "", true, false},
		{"vmm.shutdown answers 200", "PUT", "/api/v1/vmm.shutdown", "", 200, "", true, true},
		{"info with a wrong state name", "GET", "/api/v1/vm.info", "", 200, `{"config":{"payload":{"kernel":"/k"}},"state":"Sleeping"}`, true, false},
		{"info", "GET", "/api/v1/vm.info", "", 200, `{"config":{"payload":{"kernel":"/k"}},"state":"Running"}`, true, true},
		{"an unknown path", "PUT", "/api/v1/vm.frobnicate", "", 404, "", false, true},
		{"outside the base path", "GET", "/vmm.ping", "", 200, `{"version":"x"}`, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, resp := exchange(tc.method, tc.path, tc.req, tc.status, tc.resp)
			if err := c.CheckRequest(r); (err == nil) != tc.wantReqOK {
				t.Errorf("CheckRequest: %v, want ok=%v", err, tc.wantReqOK)
			}
			if err := c.CheckResponse(r, resp); (err == nil) != tc.wantRespOK {
				t.Errorf("CheckResponse: %v, want ok=%v", err, tc.wantRespOK)
			}
			// The bodies are restored for the caller.
			if b, _ := io.ReadAll(resp.Body); string(b) != tc.resp {
				t.Errorf("response body after the check: %q, want %q", b, tc.resp)
			}
		})
	}
}
