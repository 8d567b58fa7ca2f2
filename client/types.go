package client

import (
	"encoding/json"
	"time"

	"wb/session"
)

// The API's objects that package session defines for the whole platform: one definition, the
// one the gateway answers with.
type (
	Session         = session.Session
	SessionState    = session.State
	Resources       = session.Resources
	ResourceRequest = session.ResourceRequest
	Snapshot        = session.Snapshot
	Run             = session.Run
	ExecResult      = session.ExecResult
	ExecEnd         = session.ExecEnd
	Deleted         = session.DeletedObject
	Time            = session.Time
)

// List is one page of a list: Data, and NextCursor (nil on the last page) to ask for the next.
type List[T any] = session.List[T]

// Page selects a page of a list: at most Limit items (1–100; 0: the server's default of 10)
// after Cursor (a previous page's NextCursor; empty: the first page).
type Page struct {
	Limit  int
	Cursor string
}

// CreateSessionRequest is the body of POST /v1/sessions. Zero values are left out (the
// server's defaults apply); Tier is required (1–4).
type CreateSessionRequest struct {
	Tier         int               `json:"tier"`
	Template     string            `json:"template,omitempty"`
	Region       string            `json:"region,omitempty"`
	Resources    *ResourceRequest  `json:"resources,omitempty"`
	IdleTimeoutS int               `json:"idle_timeout_s,omitempty"`
	MaxLifetimeS int               `json:"max_lifetime_s,omitempty"`
	EndUserID    string            `json:"end_user_id,omitempty"`
	PolicyID     string            `json:"policy_id,omitempty"`
	VolumeID     string            `json:"volume_id,omitempty"`
	RestoreFrom  string            `json:"restore_from,omitempty"` // a ready snapshot's id
	Metadata     map[string]string `json:"metadata,omitempty"`
}

// UpdateSessionRequest is the body of PATCH /v1/sessions/{id}: the timers to change (zero:
// unchanged). A new max lifetime counts from started_at.
type UpdateSessionRequest struct {
	IdleTimeoutS int `json:"idle_timeout_s,omitempty"`
	MaxLifetimeS int `json:"max_lifetime_s,omitempty"`
}

// ListSessionsRequest filters GET /v1/sessions.
type ListSessionsRequest struct {
	Page
	State     SessionState
	EndUserID string
}

// SnapshotRequest is the body of POST /v1/sessions/{id}:snapshot.
type SnapshotRequest struct {
	IncludeMemory bool `json:"include_memory,omitempty"`
}

// ExecRequest runs one command. Give Command (run by /bin/sh -c) or Argv, not both.
type ExecRequest struct {
	Command  string            `json:"-"`
	Argv     []string          `json:"-"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Stdin    string            `json:"stdin,omitempty"`
	TimeoutS int               `json:"timeout_s,omitempty"` // 1–3600; 0: the server's 60
}

// MarshalJSON puts Command or Argv in the wire's one "command" field (a string or an array).
func (r ExecRequest) MarshalJSON() ([]byte, error) {
	type fields ExecRequest
	out := struct {
		Command any `json:"command"`
		fields
	}{fields: fields(r)}
	if r.Argv != nil {
		out.Command = r.Argv
	} else {
		out.Command = r.Command
	}
	return json.Marshal(out)
}

// CreateRunRequest is the body of POST /v1/runs: a run in a running session (SessionID and
// Command or Argv), or an ephemeral one (Tier 1, Runtime, Code) in a fresh session of its own.
type CreateRunRequest struct {
	SessionID string            `json:"session_id,omitempty"`
	Command   string            `json:"-"`
	Argv      []string          `json:"-"`
	Tier      int               `json:"tier,omitempty"`
	Runtime   string            `json:"runtime,omitempty"`
	Code      string            `json:"code,omitempty"`
	EndUserID string            `json:"end_user_id,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Stdin     string            `json:"stdin,omitempty"`
	TimeoutS  int               `json:"timeout_s,omitempty"`
	// NoWait answers at once, the run queued (?wait=false); poll it with GetRun.
	NoWait bool `json:"-"`
}

// MarshalJSON puts Command or Argv in the wire's "command" field, and leaves it out of an
// ephemeral run.
func (r CreateRunRequest) MarshalJSON() ([]byte, error) {
	type fields CreateRunRequest
	out := struct {
		Command any `json:"command,omitempty"`
		fields
	}{fields: fields(r)}
	if r.Argv != nil {
		out.Command = r.Argv
	} else if r.Command != "" {
		out.Command = r.Command
	}
	return json.Marshal(out)
}

// FileInfo is one entry of a directory listing.
type FileInfo struct {
	Name      string `json:"name"`
	Size      int64  `json:"size"`
	Mode      string `json:"mode"` // octal permission bits, e.g. "0644"
	IsDir     bool   `json:"is_dir"`
	IsSymlink bool   `json:"is_symlink,omitempty"`
	ModTime   string `json:"mod_time"` // RFC 3339 UTC at the file system's precision
}

// UsageRequest selects GET /v1/usage: [From, To) in whole UTC hours (zero: this month so
// far) with lines per "session" (default) or "end_user".
type UsageRequest struct {
	From, To time.Time
	GroupBy  string
}

// UsageTotals is settled usage over a range.
type UsageTotals struct {
	SessionS     int64 `json:"session_s"`
	PausedS      int64 `json:"paused_s"`
	CPUMs        int64 `json:"cpu_ms"`
	MemGiBMs     int64 `json:"mem_gib_ms"`
	EgressBytes  int64 `json:"egress_bytes"`
	CostMicroUSD int64 `json:"cost_micro_usd"`
}

// UsageLine is the settled usage of one session or one end user. DesktopID names the
// desktop a session ran (by session): a desktop's cost is the sum of its lines.
type UsageLine struct {
	SessionID string `json:"session_id,omitempty"`
	DesktopID string `json:"desktop_id,omitempty"`
	EndUserID string `json:"end_user_id,omitempty"`
	UsageTotals
}

// Usage is a usage report.
type Usage struct {
	Object  string      `json:"object"` // "usage"
	From    Time        `json:"from"`
	To      Time        `json:"to"`
	GroupBy string      `json:"group_by"`
	Totals  UsageTotals `json:"totals"`
	Data    []UsageLine `json:"data"`
}

// Template is one template of the catalog.
type Template struct {
	Object   string   `json:"object"` // "template"
	Name     string   `json:"name"`
	Digest   string   `json:"digest"`
	Ref      string   `json:"ref"`
	Runtimes []string `json:"runtimes"`
	// RuntimeVersions is each runtime's version where it is known ("python3": "3.11.2").
	RuntimeVersions  map[string]string `json:"runtime_versions,omitempty"`
	DefaultResources Resources         `json:"default_resources"`
}

// WebhookEndpoint is a registered webhook endpoint (without its secret).
type WebhookEndpoint struct {
	ID        string   `json:"id"`
	Object    string   `json:"object"` // "webhook_endpoint"
	URL       string   `json:"url"`
	Events    []string `json:"events"`
	CreatedAt Time     `json:"created_at"`
}

// WebhookEndpointCreated answers the create of an endpoint: the only time Secret (whsec_…,
// for VerifyWebhook) is shown.
type WebhookEndpointCreated struct {
	WebhookEndpoint
	Secret string `json:"secret"`
}

// CreateWebhookEndpointRequest is the body of POST /v1/webhook_endpoints.
type CreateWebhookEndpointRequest struct {
	URL    string   `json:"url"`
	Events []string `json:"events"`
}

// WebhookDelivery is one attempt to deliver one event to one endpoint.
type WebhookDelivery struct {
	ID             string  `json:"id"`
	Object         string  `json:"object"` // "webhook_delivery"
	EndpointID     string  `json:"endpoint_id"`
	EventID        string  `json:"event_id"`
	EventType      string  `json:"event_type"`
	SessionID      *string `json:"session_id"`
	Attempt        int     `json:"attempt"`
	Status         string  `json:"status"` // succeeded | retrying | gave_up | failed
	ResponseStatus int     `json:"response_status"`
	Error          *string `json:"error"`
	DurationMs     int64   `json:"duration_ms"`
	CreatedAt      Time    `json:"created_at"`
	NextAttemptAt  *Time   `json:"next_attempt_at"`
}

// Policy is one version of a project's Rego policy.
type Policy struct {
	Object    string   `json:"object"` // "policy"
	ID        string   `json:"id"`     // pol_NAME@VERSION, for CreateSessionRequest.PolicyID
	Name      string   `json:"name"`
	Version   int      `json:"version"`
	Mode      string   `json:"mode"`
	Point     string   `json:"point"`
	Digest    string   `json:"digest"`
	CreatedAt Time     `json:"created_at"`
	Masked    []string `json:"masked"`
}

// PolicyDeleted answers the delete of a policy (every version of it).
type PolicyDeleted struct {
	Object   string `json:"object"` // "policy"
	Name     string `json:"name"`
	Deleted  bool   `json:"deleted"`
	Versions int    `json:"versions"` // how many versions were deleted
}

// Plugin is a project's Wasm plugin.
type Plugin struct {
	Object    string   `json:"object"` // "plugin"
	Name      string   `json:"name"`
	Digest    string   `json:"digest"`
	Points    []string `json:"points"`
	Order     int      `json:"order"`
	FailOpen  bool     `json:"fail_open"`
	SizeBytes int      `json:"size_bytes"`
	CreatedAt Time     `json:"created_at"`
}

// PluginDeleted answers the delete of a plugin.
type PluginDeleted struct {
	Object  string `json:"object"` // "plugin"
	Name    string `json:"name"`
	Deleted bool   `json:"deleted"`
}

// Plan is a set of plan limits.
type Plan struct {
	Concurrency   int `json:"concurrency"`    // sessions active at once
	RatePerSec    int `json:"rate_per_sec"`   // admission rate
	Burst         int `json:"burst"`          // admission burst
	SnapshotCount int `json:"snapshot_count"` // snapshots kept
	SnapshotGiB   int `json:"snapshot_gib"`   // snapshot storage
	NodeSharePct  int `json:"node_share_pct"` // share of any one node the project may hold
}

// Limits are the project's spend caps and the plan limits in force.
type Limits struct {
	Object                         string `json:"object"` // "limits"
	MonthlySpendCapMicroUSD        int64  `json:"monthly_spend_cap_micro_usd"`
	EndUserMonthlySpendCapMicroUSD int64  `json:"end_user_monthly_spend_cap_micro_usd"`
	Plan                                  // in force: the operator's plan, lowered where the project chose to
	SpendThisMonthMicroUSD         int64  `json:"spend_this_month_micro_usd"`
	PlanLimits                     Plan   `json:"plan"` // the operator's plan: the most each limit may be set to
}

// PutLimitsRequest sets spend caps and lowers plan limits; nil fields keep their value.
// Raising a plan limit above the operator's plan is refused (403).
type PutLimitsRequest struct {
	MonthlySpendCapMicroUSD        *int64 `json:"monthly_spend_cap_micro_usd,omitempty"`
	EndUserMonthlySpendCapMicroUSD *int64 `json:"end_user_monthly_spend_cap_micro_usd,omitempty"`
	Concurrency                    *int   `json:"concurrency,omitempty"`
	RatePerSec                     *int   `json:"rate_per_sec,omitempty"`
	Burst                          *int   `json:"burst,omitempty"`
	SnapshotCount                  *int   `json:"snapshot_count,omitempty"`
	SnapshotGiB                    *int   `json:"snapshot_gib,omitempty"`
	NodeSharePct                   *int   `json:"node_share_pct,omitempty"`
}
