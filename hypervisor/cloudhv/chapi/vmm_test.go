package chapi

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"wb/hypervisor/cloudhv/chspec"
)

// answer is a canned answer of the test VMM.
type answer struct {
	status int
	body   string
	// unchecked: the answer deliberately breaks the document (to test the client's
	// defences), so the contract check is skipped for it.
	unchecked bool
}

// received is one request the test VMM got.
type received struct {
	method, path, contentType, body string
	// sized: the body came with a Content-Length, not chunked (CH's micro_http expects
	// one).
	sized bool
}

// contractVMM is a minimal stand-in for the VMM's API server on a Unix socket. Every
// request it receives goes through chspec.CheckRequest and every answer it sends through
// chspec.CheckResponse; a mismatch fails the test.
type contractVMM struct {
	t       *testing.T
	checker *chspec.Checker
	socket  string

	mu       sync.Mutex
	answers  map[string]answer // by "METHOD op", e.g. "PUT vm.pause"
	received []received
}

func newContractVMM(t *testing.T, answers map[string]answer) *contractVMM {
	t.Helper()
	checker, err := chspec.NewChecker()
	if err != nil {
		t.Fatal(err)
	}
	v := &contractVMM{t: t, checker: checker, answers: answers}
	v.socket = listenUnix(t, v)
	return v
}

// listenUnix serves h on a Unix socket in a fresh directory and returns its path.
func listenUnix(t testing.TB, h http.Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return path
}

func (v *contractVMM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := v.checker.CheckRequest(r); err != nil {
		v.t.Errorf("the client sent a request the document does not allow: %v", err)
	}
	body, _ := io.ReadAll(r.Body)
	op := strings.TrimPrefix(r.URL.Path, chspec.BasePath+"/")
	v.mu.Lock()
	v.received = append(v.received, received{r.Method, op, r.Header.Get("Content-Type"), string(body),
		r.ContentLength == int64(len(body)) && len(r.TransferEncoding) == 0})
	a, ok := v.answers[r.Method+" "+op]
	v.mu.Unlock()
	if !ok {
		v.t.Errorf("the test VMM has no answer for %s %s", r.Method, op)
		a = answer{status: http.StatusNotFound, body: `["Not Found"]`}
	}
	resp := &http.Response{StatusCode: a.status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(a.body))}
	if a.body != "" {
		resp.Header.Set("Content-Type", "application/json")
	}
	if !a.unchecked {
		if err := v.checker.CheckResponse(r, resp); err != nil {
			v.t.Errorf("the test VMM's canned answer breaks the document: %v", err)
		}
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// last returns the last request received.
func (v *contractVMM) last() received {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.received) == 0 {
		v.t.Fatal("the test VMM received nothing")
	}
	return v.received[len(v.received)-1]
}
