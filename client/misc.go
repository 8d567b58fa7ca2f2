package client

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// GetUsage answers the usage report of the project.
func (c *Client) GetUsage(ctx context.Context, req UsageRequest) (*Usage, error) {
	q := url.Values{}
	if !req.From.IsZero() {
		q.Set("from", req.From.UTC().Format(time.RFC3339))
	}
	if !req.To.IsZero() {
		q.Set("to", req.To.UTC().Format(time.RFC3339))
	}
	if req.GroupBy != "" {
		q.Set("group_by", req.GroupBy)
	}
	var u Usage
	return &u, c.do(ctx, http.MethodGet, "/v1/usage", q, nil, &u)
}

// ListTemplates answers the template catalog.
func (c *Client) ListTemplates(ctx context.Context) (*List[Template], error) {
	var l List[Template]
	return &l, c.do(ctx, http.MethodGet, "/v1/templates", nil, nil, &l)
}

// CreateWebhookEndpoint registers an endpoint; the answer's Secret verifies its deliveries.
func (c *Client) CreateWebhookEndpoint(ctx context.Context, req CreateWebhookEndpointRequest) (*WebhookEndpointCreated, error) {
	var e WebhookEndpointCreated
	return &e, c.do(ctx, http.MethodPost, "/v1/webhook_endpoints", nil, req, &e)
}

// ListWebhookEndpoints answers the project's endpoints.
func (c *Client) ListWebhookEndpoints(ctx context.Context) (*List[WebhookEndpoint], error) {
	var l List[WebhookEndpoint]
	return &l, c.do(ctx, http.MethodGet, "/v1/webhook_endpoints", nil, nil, &l)
}

// GetWebhookEndpoint answers one endpoint.
func (c *Client) GetWebhookEndpoint(ctx context.Context, id string) (*WebhookEndpoint, error) {
	var e WebhookEndpoint
	return &e, c.do(ctx, http.MethodGet, "/v1/webhook_endpoints/"+pathID(id), nil, nil, &e)
}

// DeleteWebhookEndpoint removes an endpoint.
func (c *Client) DeleteWebhookEndpoint(ctx context.Context, id string) (*Deleted, error) {
	var d Deleted
	return &d, c.do(ctx, http.MethodDelete, "/v1/webhook_endpoints/"+pathID(id), nil, nil, &d)
}

// ListWebhookDeliveries answers one page of an endpoint's delivery attempts, newest first.
func (c *Client) ListWebhookDeliveries(ctx context.Context, endpointID string, p Page) (*List[WebhookDelivery], error) {
	var l List[WebhookDelivery]
	return &l, c.do(ctx, http.MethodGet, "/v1/webhook_endpoints/"+pathID(endpointID)+"/deliveries", pageQuery(nil, p), nil, &l)
}

// PutPolicy stores a new version of the named Rego policy (mode enforce) and answers it.
func (c *Client) PutPolicy(ctx context.Context, name, rego string) (*Policy, error) {
	return c.PutPolicyMode(ctx, name, rego, "")
}

// PutPolicyMode is PutPolicy with the mode the version runs in: enforce, warn or dryrun ("":
// the server's enforce).
func (c *Client) PutPolicyMode(ctx context.Context, name, rego, mode string) (*Policy, error) {
	var q url.Values
	if mode != "" {
		q = url.Values{"mode": {mode}}
	}
	var p Policy
	return &p, c.doRaw(ctx, http.MethodPut, "/v1/policies/"+pathID(name), q, []byte(rego), "text/plain", &p)
}

// ListPolicies answers the latest version of each of the project's policies.
func (c *Client) ListPolicies(ctx context.Context) (*List[Policy], error) {
	var l List[Policy]
	return &l, c.do(ctx, http.MethodGet, "/v1/policies", nil, nil, &l)
}

// GetPolicyVersions answers every version of one policy.
func (c *Client) GetPolicyVersions(ctx context.Context, name string) (*List[Policy], error) {
	var l List[Policy]
	return &l, c.do(ctx, http.MethodGet, "/v1/policies/"+pathID(name), nil, nil, &l)
}

// DeletePolicy deletes every version of a policy. While a live session pins one of them the
// API answers 409 (an *Error naming the sessions) and nothing is deleted.
func (c *Client) DeletePolicy(ctx context.Context, name string) (*PolicyDeleted, error) {
	var d PolicyDeleted
	return &d, c.do(ctx, http.MethodDelete, "/v1/policies/"+pathID(name), nil, nil, &d)
}

// PutPluginRequest places a Wasm module: at the decision points named (admission, runtime,
// spend), in Order among the project's plugins; FailOpen allows (with a warning) when the
// plugin fails instead of denying.
type PutPluginRequest struct {
	Wasm     []byte
	Points   []string
	Order    int
	FailOpen bool
}

// PutPlugin stores (or replaces) the named plugin.
func (c *Client) PutPlugin(ctx context.Context, name string, req PutPluginRequest) (*Plugin, error) {
	q := url.Values{}
	if len(req.Points) > 0 {
		q.Set("points", strings.Join(req.Points, ","))
	}
	if req.Order != 0 {
		q.Set("order", strconv.Itoa(req.Order))
	}
	if req.FailOpen {
		q.Set("fail_open", "true")
	}
	var p Plugin
	return &p, c.doRaw(ctx, http.MethodPut, "/v1/plugins/"+pathID(name), q, req.Wasm, "application/wasm", &p)
}

// ListPlugins answers the project's plugins.
func (c *Client) ListPlugins(ctx context.Context) (*List[Plugin], error) {
	var l List[Plugin]
	return &l, c.do(ctx, http.MethodGet, "/v1/plugins", nil, nil, &l)
}

// GetPlugin answers one plugin.
func (c *Client) GetPlugin(ctx context.Context, name string) (*Plugin, error) {
	var p Plugin
	return &p, c.do(ctx, http.MethodGet, "/v1/plugins/"+pathID(name), nil, nil, &p)
}

// DeletePlugin removes a plugin.
func (c *Client) DeletePlugin(ctx context.Context, name string) (*PluginDeleted, error) {
	var d PluginDeleted
	return &d, c.do(ctx, http.MethodDelete, "/v1/plugins/"+pathID(name), nil, nil, &d)
}

// doRaw sends body as contentType (not JSON) and decodes a JSON answer into out.
func (c *Client) doRaw(ctx context.Context, method, path string, q url.Values, body []byte, contentType string, out any) error {
	resp, err := c.send(ctx, request{method: method, path: path, query: q, bodyReader: bytes.NewReader(body), contentType: contentType})
	if err != nil {
		return err
	}
	return decodeJSON(resp, method, path, out)
}

// GetLimits answers the project's spend caps, plan limits and spend this month.
func (c *Client) GetLimits(ctx context.Context) (*Limits, error) {
	var l Limits
	return &l, c.do(ctx, http.MethodGet, "/v1/limits", nil, nil, &l)
}

// PutLimits changes spend caps and lowers plan limits.
func (c *Client) PutLimits(ctx context.Context, req PutLimitsRequest) (*Limits, error) {
	var l Limits
	return &l, c.do(ctx, http.MethodPut, "/v1/limits", nil, req, &l)
}
