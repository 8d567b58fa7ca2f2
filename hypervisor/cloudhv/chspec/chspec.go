package chspec

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/pb33f/go-yaml"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	valerrors "github.com/pb33f/libopenapi-validator/errors"
)

//go:embed cloud-hypervisor.yaml
var document []byte

// Document returns the API description (a copy; callers may keep it).
func Document() []byte { return bytes.Clone(document) }

// BasePath is the path prefix of every endpoint (the document's server is
// http://localhost/api/v1).
const BasePath = "/api/v1"

// Checker validates requests and responses against the document. It is safe for concurrent
// use.
type Checker struct {
	v validator.Validator
}

// NewChecker parses the document once.
func NewChecker() (*Checker, error) {
	doc, err := libopenapi.NewDocument(document)
	if err != nil {
		return nil, fmt.Errorf("chspec: parse cloud-hypervisor.yaml: %w", err)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		return nil, fmt.Errorf("chspec: build the model: %w", err)
	}
	stringifyMappingKeys(model.Index.GetRootNode())
	return &Checker{v: validator.NewValidatorFromV3Model(&model.Model)}, nil
}

// stringifyMappingKeys tags every mapping key of the parsed document as a string. The
// document writes most status codes unquoted (`200:`), which YAML reads as integers; the
// validator renders the whole document to JSON to compile a body schema that has $refs,
// and encoding/json cannot encode a map with integer keys, so every body schema failed to
// compile ("failed to unmarshal JSON schema resource …: EOF"). JSON keys are strings
// anyway, so this changes no meaning; the embedded file stays byte for byte upstream's.
func stringifyMappingKeys(n *yaml.Node) {
	if n == nil {
		return
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.Tag != "!!str" {
				k.Tag = "!!str"
			}
		}
	}
	for _, c := range n.Content {
		stringifyMappingKeys(c)
	}
}

// CheckRequest reports how r differs from the document. r's body is read and restored.
func (c *Checker) CheckRequest(r *http.Request) error {
	body, err := restoreBody(&r.Body)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(r.URL.Path, BasePath+"/") {
		return fmt.Errorf("chspec: %s %s: path is not below %s", r.Method, r.URL.Path, BasePath)
	}
	rc := r.Clone(r.Context())
	rc.Body = io.NopCloser(bytes.NewReader(body))
	if ok, errs := c.v.ValidateHttpRequest(rc); !ok {
		return describe(r, "request", errs)
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
	rc := r.Clone(r.Context())
	rc.Body = http.NoBody
	rr := *resp
	rr.Body = io.NopCloser(bytes.NewReader(body))
	if ok, errs := c.v.ValidateHttpResponse(rc, &rr); !ok {
		return describe(r, "response", errs)
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

func describe(r *http.Request, what string, errs []*valerrors.ValidationError) error {
	var out []error
	for _, e := range errs {
		msg := e.Message
		if e.Reason != "" {
			msg += ": " + e.Reason
		}
		for _, se := range e.SchemaValidationErrors {
			msg += "; " + se.KeywordLocation + ": " + se.Reason
		}
		out = append(out, errors.New(msg))
	}
	return fmt.Errorf("chspec: %s %s: %s does not match cloud-hypervisor.yaml: %w", r.Method, r.URL.Path, what, errors.Join(out...))
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}
