package client

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// The OpenAPI document the gateway serves; the SDK is held to it here (it never imports the
// gateway).
const openAPIPath = "../gateway/openapi.json"

// operationsOutsideSDK are the document's operations the SDK deliberately does not call:
// operator routes (admin key, metrics), the document itself, the health check, the catch-all
// that only answers errors.
var operationsOutsideSDK = []string{"health", "metrics", "getOpenAPI", "adminCreateProject", "adminGetPlan",
	"adminPutPlan", "adminListNodes", "adminDrainNode", "adminRevokeKey", "sessionActionMissing",
	// A desktop's MCP endpoint speaks MCP, not the API: an MCP client calls it, with
	// MCPHTTPClient as its HTTP client.
	"desktopMCP", "desktopMCPStream"}

// methodOf maps an operationId to the Client method that calls it when the name is not the
// operationId with its first letter upper-cased.
var methodOf = map[string]string{
	"execSession":       "Exec",
	"readSessionFile":   "ListFiles", // its JSON answer (list=1); DownloadFile reads the bytes
	"writeSessionFile":  "UploadFile",
	"deleteSessionFile": "DeleteFile",
	"openSessionPty":    "OpenPTY",
	"readDesktopFile":   "ListDesktopFiles", // as readSessionFile
	"writeDesktopFile":  "UploadDesktopFile",
	"deleteDesktopFile": "DeleteDesktopFile",
}

// driftExceptions are deliberate differences, by "Schema.property" (the property only one
// side has) — each with its reason.
var driftExceptions = map[string]string{
	// ExecRequest and CreateRunRequest put Command or Argv in "command" (MarshalJSON).
	"ExecRequest.command":      "MarshalJSON writes it from Command or Argv",
	"CreateRunRequest.command": "MarshalJSON writes it from Command or Argv",
}

type openAPIDoc struct {
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Schemas map[string]*schema `json:"schemas"`
	} `json:"components"`
}

type schema struct {
	Ref        string             `json:"$ref"`
	Type       any                `json:"type"`
	Properties map[string]*schema `json:"properties"`
	Items      *schema            `json:"items"`
}

type operation struct {
	OperationID string `json:"operationId"`
	RequestBody struct {
		Content map[string]struct {
			Schema *schema `json:"schema"`
		} `json:"content"`
	} `json:"requestBody"`
	Responses map[string]struct {
		Content map[string]struct {
			Schema *schema `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

func loadOpenAPI(t *testing.T) *openAPIDoc {
	t.Helper()
	b, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	var d openAPIDoc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", openAPIPath, err)
	}
	return &d
}

func (d *openAPIDoc) resolve(s *schema) (*schema, string) {
	name := ""
	for s != nil && s.Ref != "" {
		name = strings.TrimPrefix(s.Ref, "#/components/schemas/")
		s = d.Components.Schemas[name]
	}
	return s, name
}

// jsonFields answers the JSON names of t's fields (embedded structs flattened) and their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// compareSchema reports every property that the schema and the Go type do not share, both
// ways, and walks into nested objects and arrays.
func (d *openAPIDoc) compareSchema(errorf func(string, ...any), s *schema, name string, gt reflect.Type, seen map[string]bool) {
	s, ref := d.resolve(s)
	if ref != "" {
		name = ref
	}
	for gt.Kind() == reflect.Pointer || gt.Kind() == reflect.Slice || gt.Kind() == reflect.Map {
		if gt.Kind() == reflect.Slice && s != nil && s.Items != nil {
			d.compareSchema(errorf, s.Items, name+"[]", gt.Elem(), seen)
			return
		}
		gt = gt.Elem()
	}
	if s == nil || s.Properties == nil || gt.Kind() != reflect.Struct {
		return
	}
	key := name + "/" + gt.String()
	if seen[key] {
		return
	}
	seen[key] = true
	fields := jsonFields(gt)
	for _, p := range sortedKeys(s.Properties) {
		ft, ok := fields[p]
		if !ok {
			if driftExceptions[name+"."+p] == "" {
				errorf("schema %s has property %q that the SDK's %s lacks", name, p, gt)
			}
			continue
		}
		d.compareSchema(errorf, s.Properties[p], name+"."+p, ft, seen)
	}
	for _, f := range sortedKeys(fields) {
		if _, ok := s.Properties[f]; !ok && driftExceptions[name+"."+f] == "" {
			errorf("the SDK's %s has field %q that schema %s lacks", gt, f, name)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestOpenAPIDrift: every operation of the document (but the listed exceptions) has a Client
// method; the JSON body it sends and the JSON answer it decodes have exactly the properties
// of the document's schemas, nested objects included.
func TestOpenAPIDrift(t *testing.T) {
	d := loadOpenAPI(t)
	ct := reflect.TypeFor[*Client]()
	seen := map[string]bool{}
	called := 0
	for _, path := range sortedKeys(d.Paths) {
		for _, method := range sortedKeys(d.Paths[path]) {
			var op operation
			if json.Unmarshal(d.Paths[path][method], &op) != nil || op.OperationID == "" {
				continue // path-level parameters
			}
			if slices.Contains(operationsOutsideSDK, op.OperationID) {
				continue
			}
			name := methodOf[op.OperationID]
			if name == "" {
				r := []rune(op.OperationID)
				name = string(unicode.ToUpper(r[0])) + string(r[1:])
			}
			m, ok := ct.MethodByName(name)
			if !ok {
				t.Errorf("%s %s (%s): the SDK has no method %s", strings.ToUpper(method), path, op.OperationID, name)
				continue
			}
			called++
			if c, ok := op.RequestBody.Content["application/json"]; ok && c.Schema != nil {
				in := requestType(m.Type)
				if _, ref := d.resolve(c.Schema); ref == "EmptyObject" {
					// no fields to send: the SDK sends {}
				} else if in == nil {
					t.Errorf("%s: %s takes no request struct for the JSON body %s", op.OperationID, name, c.Schema.Ref)
				} else {
					d.compareSchema(t.Errorf, c.Schema, ref, in, seen)
				}
			}
			for _, status := range sortedKeys(op.Responses) {
				c, ok := op.Responses[status].Content["application/json"]
				if !ok || c.Schema == nil || !strings.HasPrefix(status, "2") {
					continue
				}
				if m.Type.NumOut() < 2 {
					t.Errorf("%s: %s answers no object for the %s answer %s", op.OperationID, name, status, c.Schema.Ref)
					continue
				}
				d.compareSchema(t.Errorf, c.Schema, "", m.Type.Out(0), seen)
			}
		}
	}
	// What no operation returns whole: the error body and the stream's end line.
	d.compareSchema(t.Errorf, &schema{Ref: "#/components/schemas/ErrorDetail"}, "", reflect.TypeFor[Error](), seen)
	d.compareSchema(t.Errorf, &schema{Ref: "#/components/schemas/ExecEnd"}, "", reflect.TypeFor[ExecEnd](), seen)
	if called < 25 {
		t.Errorf("only %d operations matched a method: is %s the document?", called, openAPIPath)
	}
}

// requestType is the struct a method takes for its body (a ...Request parameter).
func requestType(m reflect.Type) reflect.Type {
	for i := range m.NumIn() {
		if in := m.In(i); in.Kind() == reflect.Struct && strings.HasSuffix(in.Name(), "Request") {
			return in
		}
	}
	return nil
}

// TestDriftDetected: the comparison finds a property missing on either side (the drift test
// is not vacuous).
func TestDriftDetected(t *testing.T) {
	d := loadOpenAPI(t)
	type sessionLacking struct {
		ID    string `json:"id"`
		Extra string `json:"extra_field"`
	}
	var got []string
	collect := func(format string, args ...any) { got = append(got, fmt.Sprintf(format, args...)) }
	d.compareSchema(collect, d.Components.Schemas["Snapshot"], "Snapshot", reflect.TypeFor[sessionLacking](), map[string]bool{})
	if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, `"session_id"`) }) ||
		!slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, `"extra_field"`) }) {
		t.Errorf("a type missing session_id and adding extra_field drew %q", got)
	}
}
