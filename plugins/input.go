package plugins

import (
	"encoding/json"
	"fmt"
	"time"

	"wb/internal/mergepatch"
	"wb/session"
)

// Input is the JSON a plugin receives (ABI.md, "Input"). Build it with Admission, Runtime or
// SpendInput and pass its Marshal to Decide.
type Input struct {
	Point     string `json:"point"`
	ProjectID string `json:"project_id"`
	AtMs      int64  `json:"at_ms"`

	// admission
	Request        *session.CreateRequest `json:"request,omitempty"`
	Plan           *session.Plan          `json:"plan,omitempty"`
	ActiveSessions *int64                 `json:"active_sessions,omitempty"`

	// runtime, spend
	Session *session.Session `json:"session,omitempty"`
	Event   *RuntimeEvent    `json:"event,omitempty"`
	Spend   *Spend           `json:"spend,omitempty"`
}

// RuntimeEvent is what happened in a running guest. Type names it; Data carries its fields.
type RuntimeEvent struct {
	Type string         `json:"type"`
	AtMs int64          `json:"at_ms"`
	Data map[string]any `json:"data,omitempty"`
}

// Spend is a spend figure that crossed a cap (the quota package's CapEvent).
type Spend struct {
	Scope         string `json:"scope"` // project | end_user
	EndUserID     string `json:"end_user_id,omitempty"`
	Level         string `json:"level"` // soft | hard
	SpendMicroUSD int64  `json:"spend_micro_usd"`
	CapMicroUSD   int64  `json:"cap_micro_usd"`
	Month         string `json:"month"` // YYYY-MM
}

// Admission is the input of the admission point.
func Admission(in session.AdmissionInput, at time.Time) Input {
	req, plan, active := in.Request, in.Plan, in.Active
	return Input{Point: session.PointAdmission, ProjectID: in.ProjectID, AtMs: at.UnixMilli(),
		Request: &req, Plan: &plan, ActiveSessions: &active}
}

// Runtime is the input of the runtime point: an event of a running session. A deny asks the
// caller to stop the session (reason policy_violation).
func Runtime(project string, s *session.Session, ev RuntimeEvent, at time.Time) Input {
	return Input{Point: session.PointRuntime, ProjectID: project, AtMs: at.UnixMilli(), Session: s, Event: &ev}
}

// SpendInput is the input of the spend point; s is the session concerned, or nil for a
// project-wide figure. A deny asks the caller to stop (reason spend_cap).
func SpendInput(project string, s *session.Session, sp Spend, at time.Time) Input {
	return Input{Point: session.PointSpend, ProjectID: project, AtMs: at.UnixMilli(), Session: s, Spend: &sp}
}

// Marshal answers the JSON that Decide passes to the plugins.
func (in Input) Marshal() ([]byte, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("encode plugin input: %w", err)
	}
	return b, nil
}

// ApplyPatch applies the patches of decisions, in order, to a create request as JSON merge
// patches (RFC 7386, internal/mergepatch): a key set to null is removed, an object is merged
// key by key, anything else replaces. The caller validates the result again.
func ApplyPatch(req session.CreateRequest, decisions ...session.Decision) (session.CreateRequest, error) {
	var doc map[string]any
	patched := false
	for _, d := range decisions {
		if len(d.Patch) == 0 {
			continue
		}
		if doc == nil {
			b, err := json.Marshal(req)
			if err != nil {
				return req, fmt.Errorf("encode request: %w", err)
			}
			if err := json.Unmarshal(b, &doc); err != nil {
				return req, fmt.Errorf("decode request: %w", err)
			}
		}
		doc, _ = mergepatch.Apply(doc, d.Patch).(map[string]any)
		patched = true
	}
	if !patched {
		return req, nil
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return req, fmt.Errorf("encode patched request: %w", err)
	}
	var out session.CreateRequest
	if err := json.Unmarshal(b, &out); err != nil {
		return req, fmt.Errorf("patch does not fit the request: %w", err)
	}
	return out, nil
}
