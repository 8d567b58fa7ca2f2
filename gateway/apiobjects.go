package gateway

import (
	"wb/plugins"
	"wb/policies"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// The objects of the API that the gateway shapes itself, each the schema of the same name in
// openapi.json (schema_types_test.go holds them to it). The contract's own objects (Session,
// Snapshot, Run, List, Deleted, the exec results) are in package session.

// errorBody is every error answer: {"error": {type, code, message, param?}} (Error, and the
// last line of a streamed exec that failed, ExecStreamError).
type errorBody struct {
	Error apiError `json:"error"`
}

// Health answers GET /healthz.
type Health struct {
	Status string `json:"status"` // "ok"
}

// Project answers POST /v1/admin/projects: the only time the API key is shown.
type Project struct {
	ProjectID   string `json:"project_id"`
	Name        string `json:"name"`
	APIKey      string `json:"api_key"`
	Concurrency int    `json:"concurrency"`
}

// APIKeyRevoked answers DELETE /v1/admin/projects/{id}/keys/{prefix}.
type APIKeyRevoked struct {
	Object    string `json:"object"` // "api_key"
	ProjectID string `json:"project_id"`
	Prefix    string `json:"prefix"`
	Revoked   bool   `json:"revoked"`
}

// ProjectPlan is the operator's plan of one project.
type ProjectPlan struct {
	Object    string `json:"object"` // "plan"
	ProjectID string `json:"project_id"`
	store.Plan
}

// Limits answers GET and PUT /v1/limits.
type Limits struct {
	Object                         string `json:"object"` // "limits"
	MonthlySpendCapMicroUSD        int64  `json:"monthly_spend_cap_micro_usd"`
	EndUserMonthlySpendCapMicroUSD int64  `json:"end_user_monthly_spend_cap_micro_usd"`
	// The plan limits in force: the operator's plan, lowered where the project chose to.
	store.Plan
	SpendThisMonthMicroUSD int64 `json:"spend_this_month_micro_usd"`
	// PlanLimits is the operator's plan: the most each plan limit can be set to here.
	PlanLimits store.Plan `json:"plan"`
}

// Template is one template of the catalog, as GET /v1/templates lists it.
type Template struct {
	Object           string            `json:"object"` // "template"
	Name             string            `json:"name"`
	Digest           string            `json:"digest"`
	Ref              string            `json:"ref"`
	Runtimes         []string          `json:"runtimes"`
	RuntimeVersions  map[string]string `json:"runtime_versions,omitempty"` // where known
	DefaultResources session.Resources `json:"default_resources"`
}

// Policy is one version of a project's Rego policy.
type Policy struct {
	Object    string        `json:"object"` // "policy"
	ID        string        `json:"id"`     // pol_NAME@VERSION
	Name      string        `json:"name"`
	Version   int           `json:"version"`
	Mode      policies.Mode `json:"mode"`
	Point     string        `json:"point"`
	Digest    string        `json:"digest"`
	CreatedAt session.Time  `json:"created_at"`
	// Masked is never null: empty when the policy masks nothing.
	Masked []string `json:"masked"`
}

func policyObject(v policies.Version) Policy {
	masked := v.Masked
	if masked == nil {
		masked = []string{}
	}
	return Policy{Object: "policy", ID: v.ID, Name: v.Name, Version: v.Version, Mode: v.Mode,
		Point: v.Point, Digest: v.Digest, CreatedAt: *session.At(v.CreatedAt), Masked: masked}
}

// Plugin is a project's Wasm plugin (its current module). Its config is not shown.
type Plugin struct {
	Object    string       `json:"object"` // "plugin"
	Name      string       `json:"name"`
	Digest    string       `json:"digest"`
	Points    []string     `json:"points"`
	Order     int          `json:"order"`
	FailOpen  bool         `json:"fail_open"`
	SizeBytes int          `json:"size_bytes"`
	CreatedAt session.Time `json:"created_at"`
}

func pluginObject(pl plugins.Plugin) Plugin {
	return Plugin{Object: "plugin", Name: pl.Name, Digest: pl.Digest, Points: pl.Points, Order: pl.Order,
		FailOpen: pl.FailOpen, SizeBytes: pl.SizeBytes, CreatedAt: *session.At(pl.CreatedAt)}
}

// PluginDeleted answers DELETE /v1/plugins/{name}: plugins are named, not numbered.
type PluginDeleted struct {
	Object  string `json:"object"` // "plugin"
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

// PolicyDeleted answers DELETE /v1/policies/{name}: every version of the policy is gone.
type PolicyDeleted struct {
	Object   string `json:"object"` // "policy"
	Name     string `json:"name"`
	Deleted  bool   `json:"deleted"`
	Versions int    `json:"versions"` // how many versions were deleted
}

// WebhookEndpoint is a project's webhook endpoint, without its secret.
type WebhookEndpoint struct {
	ID        string       `json:"id"`
	Object    string       `json:"object"` // "webhook_endpoint"
	URL       string       `json:"url"`
	Events    []string     `json:"events"`
	CreatedAt session.Time `json:"created_at"`
}

// WebhookEndpointCreated answers the create of an endpoint: the only time its secret is shown.
type WebhookEndpointCreated struct {
	WebhookEndpoint
	Secret string `json:"secret"`
}

func endpointObject(ep webhooks.Endpoint) WebhookEndpoint {
	return WebhookEndpoint{ID: ep.ID, Object: ep.Object, URL: ep.URL, Events: ep.Events, CreatedAt: ep.CreatedAt}
}
