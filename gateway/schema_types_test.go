package gateway

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"wb/agent"
	"wb/desktop"
	"wb/policies"
	"wb/quota"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// apiTypes is the Go type that marshals each schema of components.schemas that the API
// answers. A response that names a schema missing here fails TestSchemaTypes, so a new
// endpoint cannot forget its type.
var apiTypes = map[string]reflect.Type{
	"Session":                reflect.TypeFor[session.Session](),
	"Desktop":                reflect.TypeFor[desktop.Desktop](),
	"DesktopList":            reflect.TypeFor[session.List[desktop.Desktop]](),
	"Resources":              reflect.TypeFor[session.Resources](),
	"Snapshot":               reflect.TypeFor[session.Snapshot](),
	"Run":                    reflect.TypeFor[session.Run](),
	"Deleted":                reflect.TypeFor[session.DeletedObject](),
	"PluginDeleted":          reflect.TypeFor[PluginDeleted](),
	"PolicyDeleted":          reflect.TypeFor[PolicyDeleted](),
	"ExecResult":             reflect.TypeFor[session.ExecResult](),
	"ExecChunk":              reflect.TypeFor[session.ExecChunk](),
	"ExecEnd":                reflect.TypeFor[session.ExecEnd](),
	"ExecStreamError":        reflect.TypeFor[errorBody](),
	"FileInfo":               reflect.TypeFor[agent.FileInfo](),
	"WebhookEndpoint":        reflect.TypeFor[WebhookEndpoint](),
	"WebhookEndpointCreated": reflect.TypeFor[WebhookEndpointCreated](),
	"WebhookDelivery":        reflect.TypeFor[webhooks.Delivery](),
	"Template":               reflect.TypeFor[Template](),
	"Project":                reflect.TypeFor[Project](),
	"Plan":                   reflect.TypeFor[store.Plan](),
	"ProjectPlan":            reflect.TypeFor[ProjectPlan](),
	"APIKeyRevoked":          reflect.TypeFor[APIKeyRevoked](),
	"Node":                   reflect.TypeFor[Node](),
	"NodeList":               reflect.TypeFor[session.List[Node]](),
	"NodeDrain":              reflect.TypeFor[NodeDrain](),
	"Limits":                 reflect.TypeFor[Limits](),
	"UsageTotals":            reflect.TypeFor[quota.UsageTotals](),
	"UsageLine":              reflect.TypeFor[quota.UsageLine](),
	"Usage":                  reflect.TypeFor[quota.Report](),
	"Policy":                 reflect.TypeFor[Policy](),
	"Plugin":                 reflect.TypeFor[Plugin](),
	"Health":                 reflect.TypeFor[Health](),
	"SessionList":            reflect.TypeFor[session.List[session.Session]](),
	"SnapshotList":           reflect.TypeFor[session.List[session.Snapshot]](),
	"WebhookEndpointList":    reflect.TypeFor[session.List[WebhookEndpoint]](),
	"WebhookDeliveryList":    reflect.TypeFor[session.List[webhooks.Delivery]](),
	"TemplateList":           reflect.TypeFor[session.List[Template]](),
	"FileList":               reflect.TypeFor[session.List[agent.FileInfo]](),
	"PolicyList":             reflect.TypeFor[session.List[Policy]](),
	"PluginList":             reflect.TypeFor[session.List[Plugin]](),
	"ErrorDetail":            reflect.TypeFor[apiError](),
	"Error":                  reflect.TypeFor[errorBody](),
}

// goEnums are the Go types whose values are a closed set, with every value: a schema of such
// a type must list exactly these in its enum.
var goEnums = map[reflect.Type][]string{
	reflect.TypeFor[session.State]():  enumStrings(session.States()),
	reflect.TypeFor[desktop.State]():  enumStrings(desktop.States()),
	reflect.TypeFor[desktop.Size]():   enumStrings(desktop.Sizes()),
	reflect.TypeFor[session.Reason](): enumStrings(session.Reasons()),
	reflect.TypeFor[policies.Mode]():  enumStrings([]policies.Mode{policies.ModeEnforce, policies.ModeWarn, policies.ModeDryrun}),
}

func enumStrings[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// ndjsonStreams are response schemas that describe a stream of JSON lines as the array of
// them; each line's schema (a oneOf of $refs) must be in apiTypes instead.
var ndjsonStreams = map[string]bool{"ExecStream": true}

// untypedResponses are the JSON answers no Go type marshals, and why.
var untypedResponses = map[string]string{
	"GET /v1/openapi.json 200": "the document itself, served as the embedded bytes",
}

func TestSchemaTypes(t *testing.T) {
	problems := schemaTypeProblems(t, OpenAPI(), apiTypes)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestSchemaTypesFindDisagreements proves the check fails, and says where, when a type and
// its schema disagree in each way it looks for.
func TestSchemaTypesFindDisagreements(t *testing.T) {
	type renamed struct {
		Status string `json:"state"`
	}
	type omitted struct {
		Status string `json:"status,omitempty"`
	}
	type pointer struct {
		Status *string `json:"status"`
	}
	type wrongKind struct {
		Status int `json:"status"`
	}
	type extra struct {
		Health
		Uptime int `json:"uptime_s"`
	}
	type notTime struct {
		Plugin
		CreatedAt string `json:"created_at"`
	}
	type itemKind struct {
		Plugin
		Points []int `json:"points"`
	}
	type fromString struct {
		quota.Report
		From string `json:"from"` // the schema's from is a $ref to Timestamp with a description
	}
	type nestedField struct {
		ID        string `json:"id"`
		Object    string `json:"object"`
		EndUserID string `json:"end_user_id"` // nullable in the schema, never null here
		SessionS  int64  `json:"session_s"`
	}
	cases := []struct {
		name   string
		schema string
		typ    reflect.Type
		want   []string // every one must appear in one problem
	}{
		{"json tag renamed", "Health", reflect.TypeFor[renamed](), []string{`Health: property "status" is in the schema, but no field of gateway.renamed has json name "status"`, `Health: field gateway.renamed.Status (json "state") is not a property of the schema`}},
		{"required but omitempty", "Health", reflect.TypeFor[omitted](), []string{`Health.status: required, but the field gateway.omitted.Status is omitempty`}},
		{"required pointer, not nullable", "Health", reflect.TypeFor[pointer](), []string{`Health.status: the field gateway.pointer.Status is a pointer, so it can be null, but the schema does not allow null`}},
		{"wrong type", "Health", reflect.TypeFor[wrongKind](), []string{`Health.status: the schema says string, the Go type int is integer`}},
		{"extra field through an embedded struct", "Health", reflect.TypeFor[extra](), []string{`Health: field gateway.extra.Uptime (json "uptime_s") is not a property of the schema`}},
		{"date-time as a string", "Plugin", reflect.TypeFor[notTime](), []string{`Plugin.created_at: the schema says format date-time; the Go type string is not session.Time or time.Time`}},
		{"array items", "Plugin", reflect.TypeFor[itemKind](), []string{`Plugin.points[]: the schema says string, the Go type int is integer`}},
		{"date-time behind a $ref with siblings", "Usage", reflect.TypeFor[fromString](), []string{`Usage.from: the schema says format date-time; the Go type string is not session.Time or time.Time`}},
		{"nullable never null", "Session", reflect.TypeFor[nestedField](), []string{`Session.end_user_id: the schema allows null, but the field gateway.nestedField.EndUserID (string) is never null`, `Session: property "tier" is in the schema`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			problems := schemaTypeProblems(t, OpenAPI(), map[string]reflect.Type{c.schema: c.typ}, onlyTable)
			joined := strings.Join(problems, "\n")
			for _, w := range c.want {
				if !strings.Contains(joined, w) {
					t.Errorf("want a problem containing\n  %s\ngot:\n  %s", w, strings.ReplaceAll(joined, "\n", "\n  "))
				}
			}
		})
	}

	// A property dropped from the document is found.
	var raw map[string]any
	if err := json.Unmarshal(OpenAPI(), &raw); err != nil {
		t.Fatal(err)
	}
	created := raw["components"].(map[string]any)["schemas"].(map[string]any)["WebhookEndpointCreated"].(map[string]any)
	delete(created["properties"].(map[string]any), "secret")
	created["required"] = []string{"id", "object", "url", "events", "created_at"}
	dropped, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := `WebhookEndpointCreated: field gateway.WebhookEndpointCreated.Secret (json "secret") is not a property of the schema`
	if joined := strings.Join(schemaTypeProblems(t, dropped, apiTypes), "\n"); !strings.Contains(joined, want) {
		t.Errorf("want a problem containing\n  %s\ngot:\n  %s", want, strings.ReplaceAll(joined, "\n", "\n  "))
	}

	// An enum that lists another value than the Go type's is found, both ways.
	if err := json.Unmarshal(OpenAPI(), &raw); err != nil {
		t.Fatal(err)
	}
	raw["components"].(map[string]any)["schemas"].(map[string]any)["PolicyMode"].(map[string]any)["enum"] = []string{"enforce", "warn", "dry_run"}
	otherEnum, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(schemaTypeProblems(t, otherEnum, apiTypes), "\n")
	for _, w := range []string{
		`Policy.mode: the Go type policies.Mode has the value "dryrun", which the schema's enum lacks`,
		`Policy.mode: the schema's enum has "dry_run", which the Go type policies.Mode does not`,
	} {
		if !strings.Contains(joined, w) {
			t.Errorf("want a problem containing\n  %s\ngot:\n  %s", w, strings.ReplaceAll(joined, "\n", "\n  "))
		}
	}

	// A response that names a schema with no Go type is found, as is a type for no schema.
	doc := strings.Replace(string(OpenAPI()), `"$ref": "#/components/schemas/Health"`, `"$ref": "#/components/schemas/Status"`, 1)
	doc = strings.Replace(doc, `"Health": {`, `"Status": {`, 1)
	joined = strings.Join(schemaTypeProblems(t, []byte(doc), apiTypes), "\n")
	for _, w := range []string{
		`GET /healthz 200 application/json answers schema Status, which has no Go type in apiTypes`,
		`apiTypes maps Health, which is not a schema of components.schemas`,
	} {
		if !strings.Contains(joined, w) {
			t.Errorf("want a problem containing\n  %s\ngot:\n  %s", w, strings.ReplaceAll(joined, "\n", "\n  "))
		}
	}
}

type checkOption int

// onlyTable compares the table's types and skips the walk over the document's responses.
const onlyTable checkOption = 1

// schemaTypeProblems compares every schema of table with its Go type and, unless onlyTable,
// every response of the document with the table; it answers one line per disagreement.
func schemaTypeProblems(t *testing.T, doc []byte, table map[string]reflect.Type, opts ...checkOption) []string {
	t.Helper()
	d, err := openapi3.NewLoader().LoadFromData(doc)
	if err != nil {
		t.Fatalf("load openapi.json: %v", err)
	}
	c := &typeChecker{schemas: d.Components.Schemas, seen: map[string]bool{}, errorSchemas: map[*openapi3.Schema]bool{}, errorRoutes: map[string][]string{}}
	names := make([]string, 0, len(table))
	for name := range table {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		sp, ok := c.schemas[name]
		if !ok {
			c.fail("apiTypes maps %s, which is not a schema of components.schemas: remove it or fix its name", name)
			continue
		}
		c.compare(name, sp, table[name])
	}
	if !slices.Contains(opts, onlyTable) {
		c.checkResponses(d, table)
		for _, p := range c.errorOrder {
			routes := c.errorRoutes[p]
			shown := strings.Join(routes[:min(3, len(routes))], ", ")
			if len(routes) > 3 {
				shown += ", …"
			}
			c.fail("%s (in %d error responses: %s)", p, len(routes), shown)
		}
	}
	return c.problems
}

type typeChecker struct {
	schemas openapi3.Schemas
	seen    map[string]bool // "schema name|Go type" already compared
	// errorSchemas are the error responses' schemas compared already: a response of
	// components.responses resolves to one *Schema wherever it is used.
	errorSchemas map[*openapi3.Schema]bool
	errorRoutes  map[string][]string // a problem of error responses → the routes with it
	errorOrder   []string
	problems     []string
}

func (c *typeChecker) fail(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// checkResponses requires every JSON answer of every operation to have a Go type: a 2xx names
// a schema of the table (or a stream whose lines do); an error answer (its schema inline in
// components.responses) is compared with errorBody. The document's maps are walked sorted, so
// that the problems come out in the same order each run.
func (c *typeChecker) checkResponses(doc *openapi3.T, table map[string]reflect.Type) {
	for _, path := range slices.Sorted(maps.Keys(doc.Paths.Map())) {
		ops := doc.Paths.Value(path).Operations()
		for _, method := range slices.Sorted(maps.Keys(ops)) {
			op := ops[method]
			if op.Responses == nil {
				continue
			}
			codes := op.Responses.Map()
			for _, code := range slices.Sorted(maps.Keys(codes)) {
				resp := codes[code].Value
				if resp == nil || resp.Content == nil {
					continue
				}
				where := fmt.Sprintf("%s %s %s", strings.ToUpper(method), path, code)
				for _, ctype := range slices.Sorted(maps.Keys(resp.Content)) {
					mt := resp.Content[ctype]
					if mt.Schema == nil || (ctype != "application/json" && ctype != "application/x-ndjson") {
						continue
					}
					c.checkResponse(where, ctype, mt.Schema, table)
				}
			}
		}
	}
}

func (c *typeChecker) checkResponse(where, ctype string, sp *openapi3.SchemaRef, table map[string]reflect.Type) {
	name := refName(sp)
	switch {
	case name != "" && ndjsonStreams[name]:
		s := sp.Value
		if s == nil || s.Items == nil || s.Items.Value == nil || len(s.Items.Value.OneOf) == 0 {
			c.fail("%s %s: stream schema %s must be an array whose items are a oneOf of $refs", where, ctype, name)
			return
		}
		for _, line := range s.Items.Value.OneOf {
			if ln := refName(line); ln == "" || table[ln] == nil {
				c.fail("%s %s: a line of stream %s is schema %q, which has no Go type in apiTypes", where, ctype, name, ln)
			}
		}
	case name != "":
		if table[name] == nil {
			c.fail("%s %s answers schema %s, which has no Go type in apiTypes: add the type that marshals it", where, ctype, name)
		}
	case strings.HasPrefix(strings.Fields(where)[2], "2"):
		if _, ok := untypedResponses[where]; !ok {
			c.fail("%s %s: an inline response schema; name it in components.schemas and map it in apiTypes", where, ctype)
		}
	default:
		// A response of components.responses is shared by many routes: compare it once.
		if s := sp.Value; s != nil {
			if c.errorSchemas[s] {
				return
			}
			c.errorSchemas[s] = true
		}
		// Many routes answer the same disagreement: say it once, with the routes.
		before := len(c.problems)
		c.compare("error response", sp, reflect.TypeFor[errorBody]())
		for _, p := range c.problems[before:] {
			if c.errorRoutes[p] == nil {
				c.errorOrder = append(c.errorOrder, p)
			}
			c.errorRoutes[p] = append(c.errorRoutes[p], where)
		}
		c.problems = c.problems[:before]
	}
}

func refName(sp *openapi3.SchemaRef) string {
	if sp == nil {
		return ""
	}
	if name, ok := strings.CutPrefix(sp.Ref, "#/components/schemas/"); ok {
		return name
	}
	return ""
}

// flat is a schema with its allOf merged in: what its JSON may be.
type flat struct {
	types      map[string]bool // "string", "integer", ..., and "null" when nullable
	format     string
	props      map[string][]*openapi3.SchemaRef // a property's schemas, one per allOf branch
	propOrder  []string                         // sorted within each schema: kin-openapi keeps no order
	required   map[string]bool
	items      []*openapi3.SchemaRef
	addl       []*openapi3.SchemaRef // additionalProperties schemas
	addlFalse  bool
	oneOf      bool
	hasObjects bool     // properties or additionalProperties: false were given
	enum       []string // the string values of enum (null left out); nil without one
}

func (c *typeChecker) flatten(sp *openapi3.SchemaRef) flat {
	f := flat{types: map[string]bool{}, props: map[string][]*openapi3.SchemaRef{}, required: map[string]bool{}}
	f.merge(sp, 0)
	return f
}

// merge adds sp to f. The loader resolves a $ref to its target's schema (a copy with the
// siblings applied, when the $ref has siblings), so sp.Value is what the JSON may be.
func (f *flat) merge(sp *openapi3.SchemaRef, depth int) {
	if depth > 10 || sp == nil {
		return
	}
	s := sp.Value
	if s == nil {
		return
	}
	if s.Type != nil {
		for _, ty := range s.Type.Slice() {
			f.types[ty] = true
		}
	}
	if s.Nullable {
		f.types["null"] = true
	}
	for _, v := range constAndEnum(s) {
		switch v.(type) {
		case nil:
			f.types["null"] = true
		case string:
			f.types["string"] = true
		case bool:
			f.types["boolean"] = true
		case float64:
			if x := v.(float64); x == float64(int64(x)) {
				f.types["integer"] = true
			} else {
				f.types["number"] = true
			}
		}
	}
	if s.Format != "" {
		f.format = s.Format
	}
	for _, v := range s.Enum {
		if str, ok := v.(string); ok {
			f.enum = append(f.enum, str)
		}
	}
	if s.Properties != nil {
		f.hasObjects = true
		for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
			if _, ok := f.props[name]; !ok {
				f.propOrder = append(f.propOrder, name)
			}
			f.props[name] = append(f.props[name], s.Properties[name])
		}
	}
	for _, r := range s.Required {
		f.required[r] = true
	}
	if s.Items != nil && s.Items.Value != nil {
		f.items = append(f.items, s.Items)
	}
	if a := s.AdditionalProperties; a.Schema != nil && a.Schema.Value != nil {
		f.addl = append(f.addl, a.Schema)
	} else if a.Has != nil && !*a.Has {
		f.addlFalse, f.hasObjects = true, true
	}
	if len(s.OneOf) > 0 || len(s.AnyOf) > 0 {
		f.oneOf = true
	}
	for _, a := range s.AllOf {
		f.merge(a, depth+1)
	}
}

// constAndEnum answers the schema's const and enum values, numbers as float64 as JSON
// would decode them.
func constAndEnum(s *openapi3.Schema) []any {
	values := slices.Clone(s.Enum)
	if s.Const != nil {
		values = append(values, s.Const)
	}
	var out []any
	for _, v := range values {
		switch x := v.(type) {
		case json.Number:
			if n, err := x.Float64(); err == nil {
				out = append(out, n)
			}
		case int, int64, uint64, float32:
			out = append(out, reflect.ValueOf(x).Convert(reflect.TypeFor[float64]()).Float())
		default:
			out = append(out, v)
		}
	}
	return out
}

var (
	sessionTimeType = reflect.TypeFor[session.Time]()
	timeType        = reflect.TypeFor[time.Time]()
	marshalerType   = reflect.TypeFor[json.Marshaler]()
)

// kindOf names the JSON type a Go type marshals as.
func kindOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Struct, reflect.Map:
		return "object"
	}
	return t.Kind().String()
}

// compare holds the schema at where to the Go type t, recursing into properties, items and
// additionalProperties.
func (c *typeChecker) compare(where string, sp *openapi3.SchemaRef, t reflect.Type) {
	if name := refName(sp); name != "" {
		key := name + "|" + t.String()
		if c.seen[key] {
			return
		}
		c.seen[key] = true
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	f := c.flatten(sp)
	if f.oneOf {
		c.fail("%s: a oneOf or anyOf schema has no single Go type; describe it with type and properties", where)
		return
	}
	isTime := t == sessionTimeType || t == timeType
	if f.format == "date-time" && !isTime {
		c.fail("%s: the schema says format date-time; the Go type %s is not session.Time or time.Time", where, t)
		return
	}
	if isTime {
		if !f.types["string"] || f.format != "date-time" {
			c.fail("%s: the Go type %s is a time; the schema must be a string with format date-time", where, t)
		}
		return
	}
	if t.Implements(marshalerType) || reflect.PointerTo(t).Implements(marshalerType) {
		c.fail("%s: the Go type %s marshals itself; the test cannot see its JSON (teach compare about it)", where, t)
		return
	}
	var want []string
	for ty := range f.types {
		if ty != "null" {
			want = append(want, ty)
		}
	}
	sort.Strings(want)
	if len(want) == 0 && f.hasObjects {
		want = []string{"object"}
	}
	if len(want) == 0 && f.types["null"] {
		return // always null: the field's check above saw that the Go type can be
	}
	if len(want) != 1 {
		c.fail("%s: the schema's type is %v; the test needs exactly one type besides null (Go type %s)", where, want, t)
		return
	}
	got := kindOf(t)
	if t.Kind() == reflect.Interface {
		c.fail("%s: the Go type %s is untyped; the schema says %s", where, t, want[0])
		return
	}
	if got != want[0] {
		c.fail("%s: the schema says %s, the Go type %s is %s", where, want[0], t, got)
		return
	}
	if values, ok := goEnums[t]; ok {
		c.compareEnum(where, f.enum, values, t)
	}
	switch got {
	case "array":
		if t.Elem().Kind() == reflect.Uint8 {
			c.fail("%s: the Go type %s marshals as a base64 string, not an array", where, t)
			return
		}
		for _, it := range f.items {
			c.compare(where+"[]", it, t.Elem())
		}
		if len(f.items) == 0 {
			c.fail("%s: an array without items; say what it holds (Go %s)", where, t.Elem())
		}
	case "object":
		if t.Kind() == reflect.Map {
			if len(f.props) > 0 {
				c.fail("%s: the schema has properties %v; the Go type %s is a map", where, f.propOrder, t)
				return
			}
			if t.Key().Kind() != reflect.String {
				c.fail("%s: the Go map %s has keys that are not strings", where, t)
			}
			for _, a := range f.addl {
				c.compare(where+"{}", a, t.Elem())
			}
			if len(f.addl) == 0 {
				c.fail("%s: the Go type %s is a map; the schema should say its values with additionalProperties", where, t)
			}
			return
		}
		c.compareStruct(where, f, t)
	}
}

// compareEnum holds the schema's enum to every value of the Go enum t, both ways.
func (c *typeChecker) compareEnum(where string, schema, goValues []string, t reflect.Type) {
	if schema == nil {
		c.fail("%s: the Go type %s takes only %v; the schema should list them in an enum", where, t, goValues)
		return
	}
	for _, v := range goValues {
		if !slices.Contains(schema, v) {
			c.fail("%s: the Go type %s has the value %q, which the schema's enum lacks", where, t, v)
		}
	}
	for _, v := range schema {
		if !slices.Contains(goValues, v) {
			c.fail("%s: the schema's enum has %q, which the Go type %s does not", where, v, t)
		}
	}
}

func (c *typeChecker) compareStruct(where string, f flat, t reflect.Type) {
	if len(f.addl) > 0 {
		c.fail("%s: the schema's additionalProperties allow any name; the Go type %s is a struct", where, t)
	}
	fields, problems := jsonFields(t)
	for _, p := range problems {
		c.fail("%s: %s", where, p)
	}
	for _, name := range f.propOrder {
		fd, ok := fields[name]
		if !ok {
			c.fail("%s: property %q is in the schema, but no field of %s has json name %q", where, name, t, name)
			continue
		}
		pw := where + "." + name
		nullable := false
		for _, p := range f.props[name] {
			if c.flatten(p).types["null"] {
				nullable = true
			}
		}
		required := f.required[name]
		canBeNull := fd.typ.Kind() == reflect.Pointer || fd.typ.Kind() == reflect.Map ||
			fd.typ.Kind() == reflect.Slice || fd.typ.Kind() == reflect.Interface
		switch {
		case required && fd.omitempty:
			c.fail("%s: required, but the field %s is omitempty: it would be left out when empty", pw, fd.path)
		case !required && !fd.omitempty && !nullable:
			c.fail("%s: the field %s is always sent, but the schema does not require it: add it to required", pw, fd.path)
		}
		if fd.typ.Kind() == reflect.Pointer && !nullable && !(fd.omitempty && !required) {
			c.fail("%s: the field %s is a pointer, so it can be null, but the schema does not allow null: make the schema's type include null, or the field a value", pw, fd.path)
		}
		if nullable && !canBeNull && !fd.omitempty {
			c.fail("%s: the schema allows null, but the field %s (%s) is never null: make it a pointer, or the schema not nullable", pw, fd.path, fd.typ)
		}
		for _, p := range f.props[name] {
			c.compare(pw, p, fd.typ)
		}
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, ok := f.props[name]; !ok {
			c.fail("%s: field %s (json %q) is not a property of the schema: add it to the schema or tag it json:\"-\"", where, fields[name].path, name)
		}
	}
}

type goField struct {
	path      string // Type.Field, through embedded structs
	typ       reflect.Type
	omitempty bool
	depth     int
	tagged    bool
}

// jsonFields answers the fields encoding/json marshals for struct t, by JSON name, following
// embedded structs with its rules: the shallowest field of a name wins, then the tagged one.
func jsonFields(t reflect.Type) (map[string]goField, []string) {
	all := map[string][]goField{}
	var problems []string
	var walk func(t reflect.Type, path string, depth int)
	walk = func(t reflect.Type, path string, depth int) {
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			ft := sf.Type
			if sf.Anonymous {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if !sf.IsExported() && et.Kind() != reflect.Struct {
					continue
				}
				if name == "" && et.Kind() == reflect.Struct {
					walk(et, path+"."+sf.Name, depth+1)
					continue
				}
			} else if !sf.IsExported() {
				continue
			}
			if slices.Contains(strings.Split(opts, ","), "string") {
				problems = append(problems, fmt.Sprintf("field %s.%s uses the json option string, which the test does not model", path, sf.Name))
			}
			tagged := name != ""
			if name == "" {
				name = sf.Name
			}
			omit := slices.Contains(strings.Split(opts, ","), "omitempty") || slices.Contains(strings.Split(opts, ","), "omitzero")
			all[name] = append(all[name], goField{path: path + "." + sf.Name, typ: ft, omitempty: omit, depth: depth, tagged: tagged})
		}
	}
	walk(t, t.String(), 0)
	out := map[string]goField{}
	for name, cands := range all {
		minDepth := cands[0].depth
		for _, c := range cands {
			minDepth = min(minDepth, c.depth)
		}
		var top, tagged []goField
		for _, c := range cands {
			if c.depth == minDepth {
				top = append(top, c)
				if c.tagged {
					tagged = append(tagged, c)
				}
			}
		}
		switch {
		case len(top) == 1:
			out[name] = top[0]
		case len(tagged) == 1:
			out[name] = tagged[0]
		default:
			problems = append(problems, fmt.Sprintf("json name %q is ambiguous in %s (encoding/json drops it)", name, t))
		}
	}
	return out, problems
}
