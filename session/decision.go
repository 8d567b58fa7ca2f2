package session

import "context"

// Decision points: admission of a create, runtime events of a guest, spend (a crossed cap).
// At each, the platform's Rego decides first, then the project's policies and plugins.
const (
	PointAdmission = "admission"
	PointRuntime   = "runtime"
	PointSpend     = "spend"
)

// Decision is what one decider (a Rego policy, a tenant plugin) says at a decision point.
type Decision struct {
	Allow    bool           `json:"allow"`
	Reasons  []string       `json:"reasons,omitempty"`
	Warnings []string       `json:"warnings,omitempty"`
	Patch    map[string]any `json:"patch,omitempty"` // defaults to apply to the request
	// Decider names who decided ("policy pol_x@3", "plugin tpl_allowlist").
	Decider string `json:"decider,omitempty"`
}

// AdmissionInput is the input of the admission point: the validated create request, the
// project's plan and its live counts.
type AdmissionInput struct {
	Request   CreateRequest `json:"request"`
	ProjectID string        `json:"project_id"`
	Plan      Plan          `json:"plan"`
	Active    int64         `json:"active_sessions"`
}

// Plan is what a project may use.
type Plan struct {
	Concurrency int `json:"concurrency"`
	RatePerSec  int `json:"rate_per_sec"`
}

// Admitter decides admission. Implementations combine the platform's Rego and the project's
// plugins; any deny wins.
type Admitter interface {
	Admit(ctx context.Context, in AdmissionInput) (Decision, error)
}
