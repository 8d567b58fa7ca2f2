package chspec

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

//go:embed cloud-hypervisor.yaml
var document []byte

// Document returns the API description (a copy; callers may keep it).
func Document() []byte { return bytes.Clone(document) }

// BasePath is the path prefix of every endpoint (the document's server is
// http://localhost/api/v1).
const BasePath = "/api/v1"

// Checker validates requests and responses against the document. It is safe for concurrent
// use: the document and its router are only read after NewChecker.
type Checker struct {
	router routers.Router
	// options: every mismatch named, not only the first; the document declares no security.
	options openapi3filter.Options
}

// NewChecker parses the document once.
func NewChecker() (*Checker, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(document)
	if err != nil {
		return nil, fmt.Errorf("chspec: parse cloud-hypervisor.yaml: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("chspec: cloud-hypervisor.yaml is no valid OpenAPI document: %w", err)
	}
	// Routes are matched on the path below BasePath (the checks strip it), whatever host
	// or scheme the caller used: the real server listens on a Unix socket.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("chspec: route the document's paths: %w", err)
	}
	return &Checker{router: router, options: openapi3filter.Options{MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}, nil
}

// route finds r's operation; r's body is left alone.
func (c *Checker) route(r *http.Request, body []byte) (*openapi3filter.RequestValidationInput, error) {
	op, ok := strings.CutPrefix(r.URL.Path, BasePath)
	if !ok || !strings.HasPrefix(op, "/") {
		return nil, fmt.Errorf("chspec: %s %s: path is not below %s", r.Method, r.URL.Path, BasePath)
	}
	rc := r.Clone(r.Context())
	rc.URL.Path, rc.URL.RawPath = op, ""
	rc.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := c.router.FindRoute(rc)
	if err != nil {
		return nil, fmt.Errorf("chspec: %s %s: %w", r.Method, r.URL.Path, err)
	}
	return &openapi3filter.RequestValidationInput{Request: rc, PathParams: params, Route: route, Options: &c.options}, nil
}

// CheckRequest reports how r differs from the document. r's body is read and restored.
func (c *Checker) CheckRequest(r *http.Request) error {
	body, err := restoreBody(&r.Body)
	if err != nil {
		return err
	}
	in, err := c.route(r, body)
	if err != nil {
		return err
	}
	if err := openapi3filter.ValidateRequest(r.Context(), in); err != nil {
		return mismatch(r, "request", err)
	}
	return nil
}

// CheckResponse reports how resp, the answer to r, differs from the document and from the
// real server's known deviations (SOURCES.md): an error answers 400, 404, 409 or 500 with a
// JSON array of strings (the server's error chain), vm.resize also with 429, and PUT
// /vmm.shutdown answers 200.
// resp's body is read and restored.
func (c *Checker) CheckResponse(r *http.Request, resp *http.Response) error {
	body, err := restoreBody(&resp.Body)
	if err != nil {
		return err
	}
	op := strings.TrimPrefix(r.URL.Path, BasePath)
	switch {
	case resp.StatusCode == http.StatusOK && op == "/vmm.shutdown" && r.Method == http.MethodPut:
		return nil
	case resp.StatusCode >= 400:
		switch {
		case resp.StatusCode == 400, resp.StatusCode == 404, resp.StatusCode == 409, resp.StatusCode == 500:
		case resp.StatusCode == http.StatusTooManyRequests && op == "/vm.resize":
			// Both the document and the server: a vCPU removal is still pending.
		default:
			return fmt.Errorf("chspec: %s %s answered %d; the server answers errors with 400, 404, 409 or 500 (and 429 to vm.resize)", r.Method, op, resp.StatusCode)
		}
		if len(bytes.TrimSpace(body)) == 0 {
			return nil // a bare error status (the router's own 404/400)
		}
		var chain []string
		if err := json.Unmarshal(body, &chain); err != nil {
			return fmt.Errorf("chspec: %s %s answered %d with %q: an error body is a JSON array of strings", r.Method, op, resp.StatusCode, truncate(body))
		}
		return nil
	}
	in, err := c.route(r, nil)
	if err != nil {
		return err
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(body)), Options: &c.options}
	if err := openapi3filter.ValidateResponse(r.Context(), out); err != nil {
		return mismatch(r, "response", err)
	}
	return nil
}

func restoreBody(b *io.ReadCloser) ([]byte, error) {
	if *b == nil || *b == http.NoBody {
		return nil, nil
	}
	data, err := io.ReadAll(*b)
	(*b).Close()
	*b = io.NopCloser(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("chspec: read body: %w", err)
	}
	return data, nil
}

func mismatch(r *http.Request, what string, err error) error {
	return fmt.Errorf("chspec: %s %s: %s does not match cloud-hypervisor.yaml: %w", r.Method, r.URL.Path, what, err)
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}
