package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// openAPIValidator validates responses against OpenAPI(); build once per test binary (sync.Once).
var openAPIValidator = sync.OnceValues(func() (routers.Router, error) {
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI())
	if err != nil {
		return nil, fmt.Errorf("load openapi.json: %w", err)
	}
	// gorillamux tries the paths in InMatchingOrder, where /v1/sessions/{id}:pause comes
	// before /v1/sessions/{id} (whose {id} also matches "sess_x:pause"); the legacy router
	// routes sess_x:pause to /v1/sessions/{id}.
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("route openapi.json: %w", err)
	}
	// A streamed exec answers one JSON value per line; the document describes the body as
	// the array of those lines, so decode it that way. openapi3filter has no per-call
	// decoder option, only this registry.
	openapi3filter.RegisterBodyDecoder("application/x-ndjson", decodeNDJSON)
	return router, nil
})

// responseOptions: an undocumented status fails, every schema error is reported, and
// schemas are validated as JSON Schema 2020-12 (type arrays with "null", const, if/then,
// contains). openapi3filter does that by itself for a 3.1 document; asking for it too
// keeps it should the document's version line change.
func responseOptions() *openapi3filter.Options {
	o := &openapi3filter.Options{
		IncludeResponseStatus:   true,
		MultiError:              true,
		SchemaValidationOptions: []openapi3.SchemaValidationOption{openapi3.EnableJSONSchema2020()},
	}
	o.WithCustomSchemaErrorFunc(schemaProblem)
	return o
}

// jsonSchemaHead starts the reason of every error of the JSON Schema 2020-12 validator; the
// URL is the name kin-openapi gives the schema it compiles, not one of ours.
const jsonSchemaHead = "jsonschema validation failed with 'https://example.com/schema.json#'"

// schemaProblem says where the value fails and why, without the schema and value dumps
// of SchemaError.Error().
func schemaProblem(e *openapi3.SchemaError) string {
	// The 2020-12 validator's reason already names each failing path, one per line.
	if rest, ok := strings.CutPrefix(e.Reason, jsonSchemaHead); ok {
		return rest
	}
	// A schema with no 2020-12 keyword in it (const, if, contains...) is validated by
	// kin-openapi's own validator, whose reason leaves the path out.
	reason := e.Reason
	if e.Origin != nil {
		reason = e.Origin.Error()
	}
	return fmt.Sprintf("at '/%s': %s", strings.Join(e.JSONPointer(), "/"), reason)
}

// decodeNDJSON decodes newline-delimited JSON into the array of its lines.
func decodeNDJSON(body io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
	lines := []any{}
	if body == nil {
		return lines, nil
	}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var v any
		if err := json.Unmarshal(line, &v); err != nil {
			return nil, fmt.Errorf("ndjson line %d: %w", n, err)
		}
		lines = append(lines, v)
	}
	return lines, sc.Err()
}

// checkResponse validates resp (whose body has already been read into body) against the
// document and answers the problems found, none when the response conforms. It re-attaches
// body to resp. A 101 (a WebSocket upgrade) is checked for its status and headers only: its
// Body is the connection, left as it is.
func checkResponse(req *http.Request, resp *http.Response, body []byte) error {
	router, err := openAPIValidator()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		if isNoRoute(resp, body) {
			// A request to no documented operation: the server's catch-all answers 404
			// no_route, which OpenAPI has no way to describe. Anything else there is a mismatch.
			return nil
		}
		return formatValidationErrors(req, resp, body, err)
	}
	err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 resp.StatusCode,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                responseOptions(),
	})
	if err != nil {
		return formatValidationErrors(req, resp, body, err)
	}
	return nil
}

// isNoRoute reports whether the response is the catch-all's {"error": {type: not_found,
// code: no_route, message}} with status 404.
func isNoRoute(resp *http.Response, body []byte) bool {
	if resp.StatusCode != http.StatusNotFound || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return false
	}
	var e struct {
		Error map[string]any `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || len(e.Error) != 3 {
		return false
	}
	msg, _ := e.Error["message"].(string)
	return e.Error["type"] == "not_found" && e.Error["code"] == "no_route" && msg != ""
}

func formatValidationErrors(req *http.Request, resp *http.Response, body []byte, err error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s → %d (%s) does not match openapi.json:", req.Method, req.URL.RequestURI(), resp.StatusCode, resp.Header.Get("Content-Type"))
	for _, p := range problems(err) {
		fmt.Fprintf(&b, "\n  - %s", strings.ReplaceAll(p, "\n", "\n      "))
	}
	const maxBody = 2000
	shown := string(body)
	if len(shown) > maxBody {
		shown = shown[:maxBody] + "…"
	}
	fmt.Fprintf(&b, "\n  body: %s", shown)
	return errors.New(b.String())
}

// problems flattens a validation error into one line per problem.
func problems(err error) []string {
	var out []string
	switch e := err.(type) {
	case openapi3.MultiError:
		for _, e := range e {
			out = append(out, problems(e)...)
		}
	case *openapi3filter.ResponseError:
		if e.Err == nil {
			return []string{e.Reason}
		}
		for _, p := range problems(e.Err) {
			sep := ": "
			if strings.HasPrefix(p, "\n") {
				sep = ":" // the 2020-12 validator's lines
			}
			out = append(out, e.Reason+sep+p)
		}
	default:
		out = append(out, err.Error())
	}
	return out
}

// validateResponse fails t unless resp conforms to the OpenAPI document for req. body is the
// response body the caller already read; it is re-attached to resp. /metrics is skipped.
func validateResponse(t testing.TB, req *http.Request, resp *http.Response, body []byte) {
	t.Helper()
	if req.URL.Path == "/metrics" {
		resp.Body = io.NopCloser(bytes.NewReader(body))
		return
	}
	if err := checkResponse(req, resp, body); err != nil {
		t.Error(err)
	}
}

// registeredRoutes are the patterns of routes() in gateway.go, except the "/" fallback.
var registeredRoutes = []string{
	"GET /healthz",
	"GET /v1/openapi.json",
	"GET /metrics",
	"POST /v1/admin/projects",
	"GET /v1/admin/projects/{id}/plan",
	"PUT /v1/admin/projects/{id}/plan",
	"DELETE /v1/admin/projects/{id}/keys/{prefix}",
	"GET /v1/admin/nodes",
	"PUT /v1/admin/nodes/{id}/draining",
	"POST /v1/sessions",
	"GET /v1/sessions",
	"GET /v1/sessions/{id}",
	"PATCH /v1/sessions/{id}",
	"DELETE /v1/sessions/{id}",
	"POST /v1/sessions/{id}", // {id}:pause, :resume, :snapshot
	"POST /v1/sessions/{id}/exec",
	"GET /v1/sessions/{id}/pty",
	"GET /v1/sessions/{id}/files",
	"PUT /v1/sessions/{id}/files",
	"DELETE /v1/sessions/{id}/files",
	"GET /v1/snapshots",
	"GET /v1/snapshots/{id}",
	"DELETE /v1/snapshots/{id}",
	"POST /v1/runs",
	"GET /v1/runs/{id}",
	"POST /v1/webhook_endpoints",
	"GET /v1/webhook_endpoints",
	"GET /v1/webhook_endpoints/{id}",
	"DELETE /v1/webhook_endpoints/{id}",
	"GET /v1/webhook_endpoints/{id}/deliveries",
	"POST /v1/desktops",
	"GET /v1/desktops",
	"GET /v1/desktops/{id}",
	"PATCH /v1/desktops/{id}",
	"DELETE /v1/desktops/{id}",
	"POST /v1/desktops/{id}", // {id}:sleep, :wake, :stop, :start
	"GET /v1/desktops/{id}/screen",
	"POST /v1/desktops/{id}/heartbeat",
	"GET /v1/desktops/{id}/files",
	"PUT /v1/desktops/{id}/files",
	"DELETE /v1/desktops/{id}/files",
	"POST /v1/desktops/{id}/mcp",
	"GET /v1/desktops/{id}/mcp",
	"GET /v1/templates",
	"GET /v1/limits",
	"PUT /v1/limits",
	"GET /v1/usage",
	"PUT /v1/policies/{name}",
	"GET /v1/policies",
	"GET /v1/policies/{name}",
	"DELETE /v1/policies/{name}",
	"PUT /v1/plugins/{name}",
	"GET /v1/plugins",
	"GET /v1/plugins/{name}",
	"DELETE /v1/plugins/{name}",
}

func TestOpenAPIDocument(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI())
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if v := doc.OpenAPI; !strings.HasPrefix(v, "3.1") || !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi version %q, want 3.1.x", v)
	}
	// Validate checks 3.1 documents with JSON Schema 2020-12 on its own (IsOpenAPI31OrLater).
	if err := doc.Validate(context.Background(), openapi3.EnableMultiError(), openapi3.EnableSchemaFormatValidation()); err != nil {
		for _, p := range problems(err) {
			t.Errorf("document: %s", p)
		}
	}
	if _, err := openAPIValidator(); err != nil {
		t.Fatal(err)
	}
	for _, pattern := range registeredRoutes {
		method, path, _ := strings.Cut(pattern, " ")
		var docPaths []string
		switch pattern {
		case "POST /v1/sessions/{id}":
			docPaths = []string{path, path + ":pause", path + ":resume", path + ":snapshot"}
		case "POST /v1/desktops/{id}":
			docPaths = []string{path + ":sleep", path + ":wake", path + ":stop", path + ":start"}
		default:
			docPaths = []string{path}
		}
		for _, p := range docPaths {
			item := doc.Paths.Value(p)
			if item == nil {
				t.Errorf("%s: no path %s in openapi.json", pattern, p)
				continue
			}
			if item.GetOperation(method) == nil {
				t.Errorf("%s: path %s has no %s operation", pattern, p, method)
			}
		}
	}
	// The document describes only routes the server has.
	known := map[string]bool{}
	for _, pattern := range registeredRoutes {
		known[pattern] = true
	}
	for _, p := range slices.Sorted(maps.Keys(doc.Paths.Map())) {
		route := p
		for _, a := range []string{":pause", ":resume", ":snapshot", ":sleep", ":wake", ":stop", ":start"} {
			route = strings.TrimSuffix(route, a)
		}
		for _, m := range slices.Sorted(maps.Keys(doc.Paths.Value(p).Operations())) {
			if !known[strings.ToUpper(m)+" "+route] {
				t.Errorf("openapi.json documents %s %s, which routes() does not register", strings.ToUpper(m), p)
			}
		}
	}
}

// fakeResponse answers status and body for method and target, as the server would.
func fakeResponse(method, target string, status int, ctype, body string, header ...string) (*http.Request, *http.Response, []byte) {
	req := httptest.NewRequest(method, target, nil)
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", ctype)
	for i := 0; i+1 < len(header); i += 2 {
		rec.Header().Add(header[i], header[i+1])
	}
	rec.WriteHeader(status)
	rec.WriteString(body)
	resp := rec.Result()
	b, _ := io.ReadAll(resp.Body)
	return req, resp, b
}

const goodSession = `{"id":"sess_0VcQ9aBcDeFgHiJkLm","object":"session","tier":2,"state":"running","project_id":"proj_1",
"end_user_id":null,"template":"tpl_base@sha256:0123abcd","region":"local","zone":null,
"resources":{"vcpu":1,"memory_mib":2048,"disk_gib":10,"size_class":"s"},"volume_id":null,"policy_id":null,
"idle_timeout_s":300,"max_lifetime_s":3600,"started_at":"2025-01-02T03:04:05.678Z","expires_at":"2025-01-02T04:04:05.678Z",
"last_activity_at":null,"cold_start":true,
"connect":{"exec_url":"http://127.0.0.1:8080/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec","pty_url":"ws://127.0.0.1:8080/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/pty"},
"usage_to_date":{"session_s":1,"cpu_ms":2,"mem_gib_ms":3,"egress_bytes":4},
"state_reason":null,"rule":null,"idle_warning_at":null,"lifetime_warning_at":null,"paused_at":null,"stopped_at":null,
"created_at":"2025-01-02T03:04:05.000Z","restore_from":null,"metadata":null}`

const goodSnapshot = `{"id":"snap_0VcQ9aBcDeFgHiJkLm","object":"snapshot","session_id":"sess_0VcQ9aBcDeFgHiJkLm","include_memory":false,
"state":"ready","size_bytes":0,"created_at":"2025-01-02T03:04:05.000Z","template":"tpl_base@sha256:0123abcd","tier":2}`

const goodFileList = `{"object":"list","data":[
{"name":"etc","size":4096,"mode":"0755","is_dir":true,"mod_time":"2025-01-02T03:04:05.123456789Z"},
{"name":"a.txt","size":3,"mode":"0644","is_dir":false,"mod_time":"2025-01-02T03:04:05Z"},
{"name":"link","size":5,"mode":"0777","is_dir":false,"is_symlink":true,"mod_time":"2025-01-02T03:04:05.5Z"}],
"next_cursor":null}`

func TestOpenAPIAcceptsGoodResponses(t *testing.T) {
	errBody := func(typ, code string) string {
		return `{"error":{"type":"` + typ + `","code":"` + code + `","message":"m"}}`
	}
	cases := []struct {
		method, target string
		status         int
		ctype, body    string
		header         []string
	}{
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", goodSession, nil},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm:pause", 200, "application/json", strings.Replace(goodSession, `"running"`, `"paused"`, 1), nil},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm:resume", 200, "application/json", goodSession, []string{"Idempotent-Replayed", "true"}},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm:snapshot", 201, "application/json", goodSnapshot, nil},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm:snapshot", 502, "application/json", errBody("api_error", "snapshot_failed"), nil},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm:pause", 409, "application/json", errBody("invalid_state", "invalid_state"), nil},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 404, "application/json", errBody("not_found", "no_route"), nil},
		{"POST", "/v1/sessions", 201, "application/json", strings.Replace(goodSession, `"running"`, `"pending"`, 1), []string{"Warning", `299 wb "tier 4 is costly"`}},
		{"POST", "/v1/sessions", 429, "application/json", errBody("rate_limited", "concurrency_limit"), []string{"Retry-After", "1"}},
		{"GET", "/v1/sessions?limit=2", 200, "application/json", `{"object":"list","data":[` + goodSession + `],"next_cursor":"sess_0VcQ9aBcDeFgHiJkLm"}`, nil},
		{"DELETE", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 202, "application/json", strings.Replace(goodSession, `"running"`, `"stopping"`, 1), nil},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec", 200, "application/json", `{"exit_code":0,"stdout":"hi\n","stderr":"","duration_ms":3,"truncated":false,"stdout_bytes":3,"stderr_bytes":0}`, nil},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec", 200, "application/x-ndjson",
			`{"stream":"stdout","data":"hi\n"}` + "\n" + `{"exit_code":0,"duration_ms":3,"timed_out":false}` + "\n", nil},
		{"GET", "/v1/snapshots", 200, "application/json", `{"object":"list","data":[` + goodSnapshot + `],"next_cursor":null}`, nil},
		{"DELETE", "/v1/snapshots/snap_1", 200, "application/json", `{"id":"snap_1","object":"snapshot","deleted":true}`, nil},
		{"GET", "/v1/sessions/sess_x", 401, "application/json", errBody("unauthenticated", "unauthenticated"), nil},
		{"GET", "/healthz", 200, "application/json", `{"status":"ok"}`, nil},
		{"PUT", "/v1/nowhere", 404, "application/json", errBody("not_found", "no_route"), nil},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=/etc/hostname", 200, "application/octet-stream", "\x00\xffbinary\n", nil},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=empty", 200, "application/octet-stream", "", nil},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=/&list=1", 200, "application/json", goodFileList, nil},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=/none", 404, "application/json", errBody("not_found", "not_found"), nil},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files", 400, "application/json",
			`{"error":{"type":"invalid_request","code":"invalid_request","message":"path: required","param":"path"}}`, nil},
		{"PUT", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a.txt", 204, "", "", nil},
		{"PUT", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a.txt", 413, "application/json", errBody("invalid_request", "too_large"), nil},
		{"PUT", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a.txt", 409, "application/json", errBody("invalid_state", "invalid_state"), nil},
		{"PUT", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a.txt", 503, "application/json", errBody("api_error", "no_node"), nil},
		{"DELETE", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a.txt", 204, "", "", nil},
		{"DELETE", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a.txt", 502, "application/json", errBody("api_error", "node_error"), nil},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/pty?cols=0", 400, "application/json",
			`{"error":{"type":"invalid_request","code":"invalid_request","message":"cols: must be an integer 1–1000","param":"cols"}}`, nil},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/pty", 426, "text/plain; charset=utf-8", "WebSocket protocol violation\n", []string{"Upgrade", "websocket"}},
		{"GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/pty", 101, "", "",
			[]string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="}},
	}
	for _, c := range cases {
		req, resp, body := fakeResponse(c.method, c.target, c.status, c.ctype, c.body, c.header...)
		if err := checkResponse(req, resp, body); err != nil {
			t.Error(err)
		}
	}
	// /metrics is skipped, and the body stays readable.
	req, resp, body := fakeResponse("GET", "/metrics", 200, "text/plain; version=0.0.4", "# HELP x\n")
	validateResponse(t, req, resp, body)
	if b, _ := io.ReadAll(resp.Body); string(b) != "# HELP x\n" {
		t.Errorf("body not re-attached: %q", b)
	}
}

func TestOpenAPIRejectsWrongResponse(t *testing.T) {
	var noState map[string]any
	if err := json.Unmarshal([]byte(goodSession), &noState); err != nil {
		t.Fatal(err)
	}
	delete(noState, "state")
	missing, _ := json.Marshal(noState)
	cases := []struct {
		name, method, target string
		status               int
		ctype, body          string
		header               []string
	}{
		{"missing state", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", string(missing), nil},
		{"bogus state", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `"running"`, `"bogus"`, 1), nil},
		{"omitted nullable", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `"zone":null,`, ``, 1), nil},
		{"nullable of another type", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `"zone":null`, `"zone":5`, 1), nil},
		{"null where not nullable", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `"region":"local"`, `"region":null`, 1), nil},
		{"object not the const", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `"object":"session"`, `"object":"snapshot"`, 1), nil},
		{"tier 5", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `"tier":2`, `"tier":5`, 1), nil},
		{"time without ms", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `05.000Z`, `05Z`, 1), nil},
		{"extra field", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 200, "application/json", strings.Replace(goodSession, `{"id"`, `{"version":3,"id"`, 1), nil},
		{"undocumented status", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm", 418, "application/json", goodSession, nil},
		{"snapshot where session expected", "POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm:pause", 200, "application/json", goodSnapshot, nil},
		{"429 without Retry-After", "POST", "/v1/sessions", 429, "application/json", `{"error":{"type":"rate_limited","code":"rate_limited","message":"m"}}`, nil},
		{"wrong error code for status", "GET", "/v1/sessions/sess_x", 404, "application/json", `{"error":{"type":"invalid_state","code":"invalid_state","message":"m"}}`, nil},
		{"error param null", "GET", "/v1/sessions/sess_x", 404, "application/json", `{"error":{"type":"not_found","code":"not_found","message":"m","param":null}}`, nil},
		{"list without next_cursor", "GET", "/v1/snapshots", 200, "application/json", `{"object":"list","data":[]}`, nil},
		{"unrouted but not no_route", "GET", "/v1/nowhere", 200, "application/json", `{"status":"ok"}`, nil},
		{"file list entry without mode", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=/&list=1", 200, "application/json",
			strings.Replace(goodFileList, `"mode":"0644",`, ``, 1), nil},
		{"file list with a cursor", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=/&list=1", 200, "application/json",
			strings.Replace(goodFileList, `"next_cursor":null`, `"next_cursor":"x"`, 1), nil},
		{"file put answering 200", "PUT", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a.txt", 200, "application/json", `{"path":"a.txt","size":1}`, nil},
		{"101 without Upgrade", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/pty", 101, "", "", nil},
		{"101 on a files route", "GET", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/files?path=a", 101, "", "",
			[]string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Accept", "x"}},
		{"ndjson without end line", "POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec", 200, "application/x-ndjson", `{"stream":"stdout","data":"hi\n"}` + "\n", nil},
	}
	for _, c := range cases {
		req, resp, body := fakeResponse(c.method, c.target, c.status, c.ctype, c.body, c.header...)
		err := checkResponse(req, resp, body)
		if err == nil {
			t.Errorf("%s: validation passed, want a failure", c.name)
			continue
		}
		t.Logf("%s: %s", c.name, strings.SplitN(err.Error(), "\n  body:", 2)[0])
		if c.name == "missing state" && !strings.Contains(err.Error(), "state") {
			t.Errorf("%s: the error does not name the field: %v", c.name, err)
		}
		if b, _ := io.ReadAll(resp.Body); !bytes.Equal(b, body) {
			t.Errorf("%s: body not re-attached", c.name)
		}
	}
}

const goodLimits = `{"object":"limits","monthly_spend_cap_micro_usd":50000000,"end_user_monthly_spend_cap_micro_usd":0,
"concurrency":100,"rate_per_sec":100,"burst":200,"snapshot_count":100,"snapshot_gib":50,"node_share_pct":50,"spend_this_month_micro_usd":1234,
"plan":{"concurrency":100,"rate_per_sec":100,"burst":200,"snapshot_count":100,"snapshot_gib":50,"node_share_pct":50}}`

const usageTotals = `{"session_s":70,"paused_s":10,"cpu_ms":3000,"mem_gib_ms":140000,"egress_bytes":512,"cost_micro_usd":99}`

const goodUsageBySession = `{"object":"usage","from":"2025-01-01T00:00:00.000Z","to":"2025-01-02T04:00:00.000Z","group_by":"session",
"totals":` + usageTotals + `,"data":[
{"session_id":"sess_0VcQ9aBcDeFgHiJkLm","session_s":60,"paused_s":10,"cpu_ms":2000,"mem_gib_ms":120000,"egress_bytes":512,"cost_micro_usd":80},
{"session_id":"sess_0VcQ9aBcDeFgHiJkLn","session_s":10,"paused_s":0,"cpu_ms":1000,"mem_gib_ms":20000,"egress_bytes":0,"cost_micro_usd":19}]}`

// The sessions without an end user are summed in a line without end_user_id.
const goodUsageByEndUser = `{"object":"usage","from":"2025-01-01T00:00:00.000Z","to":"2025-01-02T04:00:00.000Z","group_by":"end_user",
"totals":` + usageTotals + `,"data":[
{"session_s":10,"paused_s":0,"cpu_ms":1000,"mem_gib_ms":20000,"egress_bytes":0,"cost_micro_usd":19},
{"end_user_id":"user_1","session_s":60,"paused_s":10,"cpu_ms":2000,"mem_gib_ms":120000,"egress_bytes":512,"cost_micro_usd":80}]}`

// TestOpenAPILimitsUsageAndSpendCap checks the document against synthetic answers of
// GET/PUT /v1/limits, GET /v1/usage (both group_by forms) and the 402 of the creates, shaped
// as Limits, Usage and apiError marshal them.
func TestOpenAPILimitsUsageAndSpendCap(t *testing.T) {
	capped := `{"error":{"type":"spend_cap_reached","code":"spend_cap_reached","message":"the project's monthly spend cap is reached; raise it with PUT /v1/limits"}}`
	emptyUsage := `{"object":"usage","from":"2025-01-01T00:00:00.000Z","to":"2025-01-01T01:00:00.000Z","group_by":"session",
"totals":{"session_s":0,"paused_s":0,"cpu_ms":0,"mem_gib_ms":0,"egress_bytes":0,"cost_micro_usd":0},"data":[]}`
	good := []struct {
		method, target string
		status         int
		body           string
		header         []string
	}{
		{"GET", "/v1/limits", 200, goodLimits, nil},
		{"PUT", "/v1/limits", 200, strings.Replace(goodLimits, `"concurrency":100`, `"concurrency":0`, 1), nil},
		{"PUT", "/v1/limits", 400, `{"error":{"type":"invalid_request","code":"invalid_request","message":"concurrency: must be 0–100000, got -1","param":"concurrency"}}`, nil},
		{"PUT", "/v1/limits", 415, `{"error":{"type":"invalid_request","code":"unsupported_media_type","message":"m"}}`, nil},
		{"GET", "/v1/limits", 401, `{"error":{"type":"unauthenticated","code":"unauthenticated","message":"m"}}`, nil},
		{"GET", "/v1/usage", 200, goodUsageBySession, nil},
		{"GET", "/v1/usage?group_by=session&from=2025-01-01T00:00:00Z&to=2025-01-02T03:30:00Z", 200, goodUsageBySession, nil},
		{"GET", "/v1/usage?group_by=end_user", 200, goodUsageByEndUser, nil},
		{"GET", "/v1/usage?from=2025-01-01T00:00:00Z&to=2025-01-01T01:00:00Z", 200, emptyUsage, nil},
		{"GET", "/v1/usage?group_by=tenant", 400, `{"error":{"type":"invalid_request","code":"invalid_request","message":"group_by: must be session or end_user, got \"tenant\"","param":"group_by"}}`, nil},
		{"GET", "/v1/usage?from=yesterday", 400, `{"error":{"type":"invalid_request","code":"invalid_request","message":"from: must be an RFC 3339 time, got \"yesterday\"","param":"from"}}`, nil},
		{"GET", "/v1/usage", 500, `{"error":{"type":"api_error","code":"internal","message":"internal error; it has been logged"}}`, nil},
		{"POST", "/v1/sessions", 402, capped, nil},
		{"POST", "/v1/runs", 402, capped, nil},
		{"POST", "/v1/sessions", 201, strings.Replace(goodSession, `"running"`, `"pending"`, 1),
			[]string{"Warning", `299 wb "over 80% of a monthly spend cap"`}},
	}
	for _, c := range good {
		req, resp, body := fakeResponse(c.method, c.target, c.status, "application/json", c.body+"\n", c.header...)
		if err := checkResponse(req, resp, body); err != nil {
			t.Error(err)
		}
	}

	bad := []struct {
		name, method, target string
		status               int
		body                 string
	}{
		{"limits without spend", "GET", "/v1/limits", 200, strings.Replace(goodLimits, `,"spend_this_month_micro_usd":1234`, ``, 1)},
		{"negative cap", "GET", "/v1/limits", 200, strings.Replace(goodLimits, `50000000`, `-1`, 1)},
		{"concurrency over 100000", "PUT", "/v1/limits", 200, strings.Replace(goodLimits, `"concurrency":100`, `"concurrency":100001`, 1)},
		{"limits wrong object", "PUT", "/v1/limits", 200, strings.Replace(goodLimits, `"limits"`, `"limit"`, 1)},
		{"usage without totals", "GET", "/v1/usage", 200, strings.Replace(goodUsageBySession, `"totals":`+usageTotals+`,`, ``, 1)},
		{"usage totals with an id", "GET", "/v1/usage", 200, strings.Replace(goodUsageBySession, `"totals":{`, `"totals":{"session_id":"sess_x",`, 1)},
		{"usage by session, line without session_id", "GET", "/v1/usage", 200, strings.Replace(goodUsageBySession, `"session_id":"sess_0VcQ9aBcDeFgHiJkLn",`, ``, 1)},
		{"usage by session, line with end_user_id", "GET", "/v1/usage", 200, strings.Replace(goodUsageBySession, `{"session_id"`, `{"end_user_id":"u","session_id"`, 1)},
		{"usage by end user, line with session_id", "GET", "/v1/usage?group_by=end_user", 200, strings.Replace(goodUsageByEndUser, `{"end_user_id"`, `{"session_id":"sess_x","end_user_id"`, 1)},
		{"usage bogus group_by", "GET", "/v1/usage", 200, strings.Replace(goodUsageBySession, `"group_by":"session"`, `"group_by":"tenant"`, 1)},
		{"usage from without ms", "GET", "/v1/usage", 200, strings.Replace(goodUsageBySession, `00:00:00.000Z`, `00:00:00Z`, 1)},
		{"usage unknown field in a line", "GET", "/v1/usage", 200, strings.Replace(goodUsageBySession, `"paused_s":0,`, `"paused_s":0,"region":"x",`, 1)},
		{"402 with another code", "POST", "/v1/sessions", 402, `{"error":{"type":"spend_cap_reached","code":"rate_limited","message":"m"}}`},
		{"402 on a route that does not answer it", "GET", "/v1/limits", 402, capped},
	}
	for _, c := range bad {
		req, resp, body := fakeResponse(c.method, c.target, c.status, "application/json", c.body+"\n")
		if err := checkResponse(req, resp, body); err == nil {
			t.Errorf("%s: validation passed, want a failure", c.name)
		} else {
			t.Logf("%s: %s", c.name, strings.SplitN(err.Error(), "\n  body:", 2)[0])
		}
	}
}

const goodPolicy = `{"object":"policy","id":"pol_tier4@2","name":"tier4","version":2,"mode":"warn","point":"admission",
"digest":"sha256:d4ea31a4720282dfa7fb1c8ff8693500b9d726e78b9f1a3dac0667e8cd0b2006","created_at":"2025-01-02T03:04:05.678Z",
"masked":["request.metadata.secret"]}`

const goodPlugin = `{"object":"plugin","name":"tier-cap","digest":"sha256:0123abcd","points":["admission","runtime"],"order":10,
"fail_open":false,"size_bytes":2094356,"created_at":"2025-01-02T03:04:05.678Z"}`

// TestOpenAPIPoliciesAndPlugins checks the document against synthetic answers of the policy
// and plugin routes, shaped as Policy, Plugin and apiError marshal them, and the 403
// policy_violation of exec (runExec).
func TestOpenAPIPoliciesAndPlugins(t *testing.T) {
	errBody := func(typ, code, param string) string {
		if param != "" {
			return `{"error":{"type":"` + typ + `","code":"` + code + `","message":"m","param":"` + param + `"}}`
		}
		return `{"error":{"type":"` + typ + `","code":"` + code + `","message":"m"}}`
	}
	list := func(items ...string) string {
		return `{"object":"list","data":[` + strings.Join(items, ",") + `],"next_cursor":null}`
	}
	v1 := strings.NewReplacer(`@2"`, `@1"`, `"version":2`, `"version":1`, `"warn"`, `"enforce"`).Replace(goodPolicy)
	killed := `{"error":{"type":"denied","code":"policy_violation","message":"pol_net@1: no curl"}}`
	good := []struct {
		method, target string
		status         int
		body           string
	}{
		{"PUT", "/v1/policies/tier4?mode=warn", 201, goodPolicy},
		{"PUT", "/v1/policies/tier4", 201, strings.Replace(goodPolicy, `["request.metadata.secret"]`, `[]`, 1)},
		{"PUT", "/v1/policies/net?mode=enforce", 201, strings.Replace(goodPolicy, `"admission"`, `"runtime"`, 1)},
		{"PUT", "/v1/policies/tier4", 400, `{"error":{"type":"invalid_request","code":"policy_compile_error","message":"policy does not compile: line 5, column 1: rego_parse_error: unexpected } token","param":"body:5:1"}}`},
		{"PUT", "/v1/policies/tier4?mode=loud", 400, errBody("invalid_request", "invalid_request", "mode")},
		{"PUT", "/v1/policies/Bad-Name", 400, errBody("invalid_request", "invalid_request", "name")},
		{"PUT", "/v1/policies/tier4", 400, errBody("invalid_request", "invalid_request", "body")},
		{"PUT", "/v1/policies/tier4", 401, errBody("unauthenticated", "unauthenticated", "")},
		{"PUT", "/v1/policies/tier4", 413, errBody("invalid_request", "too_large", "")},
		{"PUT", "/v1/policies/tier4", 503, errBody("api_error", "no_policies", "")},
		{"GET", "/v1/policies", 200, list(goodPolicy)},
		{"GET", "/v1/policies", 200, list()},
		{"GET", "/v1/policies/tier4", 200, list(goodPolicy, v1)},
		{"GET", "/v1/policies/nope", 404, errBody("not_found", "not_found", "")},
		{"GET", "/v1/policies/Bad-Name", 400, errBody("invalid_request", "invalid_request", "name")},
		{"DELETE", "/v1/policies/tier4", 200, `{"object":"policy","name":"tier4","deleted":true,"versions":2}`},
		{"DELETE", "/v1/policies/tier4", 409, errBody("invalid_state", "invalid_state", "")},
		{"DELETE", "/v1/policies/nope", 404, errBody("not_found", "not_found", "")},
		{"DELETE", "/v1/policies/Bad-Name", 400, errBody("invalid_request", "invalid_request", "name")},
		{"PUT", "/v1/plugins/tier-cap?points=admission,runtime&order=10", 201, goodPlugin},
		{"PUT", "/v1/plugins/tier-cap?fail_open=true", 201, strings.NewReplacer(`"admission","runtime"`, `"spend"`, `"fail_open":false`, `"fail_open":true`).Replace(goodPlugin)},
		{"PUT", "/v1/plugins/tier-cap", 400, errBody("invalid_request", "invalid_plugin", "body")},
		{"PUT", "/v1/plugins/tier-cap?order=-1", 400, errBody("invalid_request", "invalid_request", "order")},
		{"PUT", "/v1/plugins/tier-cap?fail_open=yes", 400, errBody("invalid_request", "invalid_request", "fail_open")},
		{"PUT", "/v1/plugins/tier-cap", 413, errBody("invalid_request", "too_large", "")},
		{"PUT", "/v1/plugins/tier-cap", 415, errBody("invalid_request", "unsupported_media_type", "")},
		{"PUT", "/v1/plugins/tier-cap", 503, errBody("api_error", "no_plugins", "")},
		{"GET", "/v1/plugins", 200, list(goodPlugin)},
		{"GET", "/v1/plugins", 200, list()},
		{"GET", "/v1/plugins/tier-cap", 200, goodPlugin},
		{"GET", "/v1/plugins/nope", 404, errBody("not_found", "not_found", "")},
		{"DELETE", "/v1/plugins/tier-cap", 200, `{"object":"plugin","name":"tier-cap","deleted":true}`},
		{"DELETE", "/v1/plugins/nope", 404, errBody("not_found", "not_found", "")},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec", 403, killed},
		{"POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec", 403, errBody("denied", "policy_error", "")},
		{"POST", "/v1/sessions", 403, errBody("denied", "denied", "")},
		{"POST", "/v1/runs", 403, errBody("denied", "denied", "")},
	}
	for _, c := range good {
		req, resp, body := fakeResponse(c.method, c.target, c.status, "application/json", c.body+"\n")
		if err := checkResponse(req, resp, body); err != nil {
			t.Error(err)
		}
	}
	// A runtime kill after output started ends the stream with an error line.
	req, resp, body := fakeResponse("POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec", 200, "application/x-ndjson",
		`{"stream":"stdout","data":"hi\n"}`+"\n"+killed+"\n")
	if err := checkResponse(req, resp, body); err != nil {
		t.Error(err)
	}

	bad := []struct {
		name, method, target string
		status               int
		body                 string
	}{
		{"policy without masked", "PUT", "/v1/policies/tier4", 201, strings.Replace(goodPolicy, `,
"masked":["request.metadata.secret"]`, ``, 1)},
		{"policy masked null", "PUT", "/v1/policies/tier4", 201, strings.Replace(goodPolicy, `["request.metadata.secret"]`, `null`, 1)},
		{"policy bogus mode", "PUT", "/v1/policies/tier4", 201, strings.Replace(goodPolicy, `"warn"`, `"loud"`, 1)},
		{"policy bogus point", "PUT", "/v1/policies/tier4", 201, strings.Replace(goodPolicy, `"admission"`, `"exec"`, 1)},
		{"policy id without version", "PUT", "/v1/policies/tier4", 201, strings.Replace(goodPolicy, `"pol_tier4@2"`, `"pol_tier4"`, 1)},
		{"policy version 0", "PUT", "/v1/policies/tier4", 201, strings.Replace(goodPolicy, `"version":2`, `"version":0`, 1)},
		{"policy answering 200 to a put", "PUT", "/v1/policies/tier4", 200, goodPolicy},
		{"policy versions not a list", "GET", "/v1/policies/tier4", 200, goodPolicy},
		{"policy compile error as invalid_plugin", "PUT", "/v1/policies/tier4", 400, errBody("invalid_request", "invalid_plugin", "body")},
		{"plugin where a policy is expected", "PUT", "/v1/policies/tier4", 201, goodPlugin},
		{"plugin without points", "PUT", "/v1/plugins/tier-cap", 201, strings.Replace(goodPlugin, `"points":["admission","runtime"],`, ``, 1)},
		{"plugin with no points", "PUT", "/v1/plugins/tier-cap", 201, strings.Replace(goodPlugin, `["admission","runtime"]`, `[]`, 1)},
		{"plugin bogus point", "GET", "/v1/plugins/tier-cap", 200, strings.Replace(goodPlugin, `"runtime"]`, `"exec"]`, 1)},
		{"plugin with config", "GET", "/v1/plugins/tier-cap", 200, strings.Replace(goodPlugin, `"order":10,`, `"order":10,"config":{"a":"b"},`, 1)},
		{"plugin fail_open as a string", "GET", "/v1/plugins/tier-cap", 200, strings.Replace(goodPlugin, `"fail_open":false`, `"fail_open":"false"`, 1)},
		{"plugin deleted with an id", "DELETE", "/v1/plugins/tier-cap", 200, `{"id":"tier-cap","object":"plugin","deleted":true}`},
		{"plugin 415 with another code", "PUT", "/v1/plugins/tier-cap", 415, errBody("invalid_request", "invalid_request", "")},
		{"no_plugins on a policy route", "PUT", "/v1/policies/tier4", 503, errBody("api_error", "no_plugins", "")},
		{"415 on a policy put", "PUT", "/v1/policies/tier4", 415, errBody("invalid_request", "unsupported_media_type", "")},
		{"exec 403 denied", "POST", "/v1/sessions/sess_0VcQ9aBcDeFgHiJkLm/exec", 403, errBody("denied", "denied", "")},
		{"create 403 policy_violation", "POST", "/v1/sessions", 403, killed},
		{"create 403 policy_error", "POST", "/v1/sessions", 403, errBody("denied", "policy_error", "")},
	}
	for _, c := range bad {
		req, resp, body := fakeResponse(c.method, c.target, c.status, "application/json", c.body+"\n")
		if err := checkResponse(req, resp, body); err == nil {
			t.Errorf("%s: validation passed, want a failure", c.name)
		} else {
			t.Logf("%s: %s", c.name, strings.SplitN(err.Error(), "\n  body:", 2)[0])
		}
	}
}
