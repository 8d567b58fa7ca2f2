package decide

import (
	"context"
	"fmt"
	"slices"

	"wb/plugins"
	"wb/session"
)

// Scope is what a spend figure, and a stop, covers. Scopes are ordered: a wider scope covers
// the narrower ones, so combining deciders keeps the widest (max).
type Scope int

// Scopes, narrowest first.
const (
	ScopeNone    Scope = iota // nothing (no stop)
	ScopeEndUser              // one end user's sessions
	ScopeProject              // every session of the project
)

// String is the scope's name in the API and in Rego: "", "end_user", "project".
func (s Scope) String() string {
	switch s {
	case ScopeEndUser:
		return "end_user"
	case ScopeProject:
		return "project"
	}
	return ""
}

// ParseScope reads a scope's name; "" is ScopeNone.
func ParseScope(name string) (Scope, error) {
	switch name {
	case "":
		return ScopeNone, nil
	case "end_user":
		return ScopeEndUser, nil
	case "project":
		return ScopeProject, nil
	}
	return ScopeNone, fmt.Errorf("spend scope %q: must be project or end_user", name)
}

// Level says how far spending went: a soft cap warns, a hard cap stops.
type Level int

// Levels.
const (
	LevelSoft Level = iota + 1
	LevelHard
)

// String is the level's name in the API: "soft", "hard".
func (l Level) String() string {
	if l == LevelHard {
		return "hard"
	}
	return "soft"
}

// ParseLevel reads a level's name.
func ParseLevel(name string) (Level, error) {
	switch name {
	case "soft":
		return LevelSoft, nil
	case "hard":
		return LevelHard, nil
	}
	return 0, fmt.Errorf("spend level %q: must be soft or hard", name)
}

// SpendInput is a spend figure that crossed a cap of the project (Scope project) or of one end
// user (Scope end_user, EndUserID set).
type SpendInput struct {
	Project       string
	Scope         Scope
	EndUserID     string
	Level         Level
	SpendMicroUSD int64
	CapMicroUSD   int64
	Month         string // YYYY-MM
}

// regoInput is policies/spend.rego's input: only the crossed figure and its cap.
func (in SpendInput) regoInput() map[string]any {
	caps := map[string]any{}
	m := map[string]any{"plan": map[string]any{}, "end_user_id": in.EndUserID, "caps": caps}
	if in.Scope == ScopeProject {
		m["project_spend_micro_usd"] = in.SpendMicroUSD
		caps["monthly_spend_cap_micro_usd"] = in.CapMicroUSD
	} else {
		m["end_user_spend_micro_usd"] = in.SpendMicroUSD
		caps["end_user_monthly_spend_cap_micro_usd"] = in.CapMicroUSD
	}
	return m
}

// SpendDecision is the spend point's answer.
type SpendDecision struct {
	// Stop is the widest scope whose running sessions must stop (reason spend_cap); ScopeNone
	// stops nothing.
	Stop Scope
	// DenyAdmission: refuse new sessions in the figure's scope (402) until the cap moves.
	DenyAdmission bool
	// Warnings: every decider's, and what failed.
	Warnings []string
}

// Spend is the spend point. It starts from the platform's floor — a hard cap stops the
// sessions in the figure's scope and denies admissions there — then lets the platform's and
// the project's spend policies and the project's spend plugins widen it: an enforced
// stop_sessions widens Stop, deny_admission sets DenyAdmission, a plugin's deny stops the
// figure's scope and denies admissions. Nothing a tenant's decider does or fails to do lifts
// the floor; a failure of the Rego engine or the plugin host is a warning.
func (d Decider) Spend(ctx context.Context, in SpendInput) SpendDecision {
	var out SpendDecision
	if in.Level == LevelHard {
		out.Stop, out.DenyAdmission = in.Scope, true
	}
	failed := func(what string, err error) {
		out.Warnings = append(out.Warnings, fmt.Sprintf("%s failed, so only the platform's cap applies: %v", what, err))
		d.log().WarnContext(ctx, "decide: spend decider failed; the platform's cap still applies",
			"project", in.Project, "decider", what, "err", err)
	}
	if d.Policies != nil {
		pd, err := d.Policies.Spend(ctx, in.Project, in.regoInput())
		if err != nil {
			failed("spend policies", err)
		} else {
			out.Warnings = append(out.Warnings, slices.Clone(pd.Warnings)...)
			scope, err := ParseScope(pd.StopScope)
			if err != nil {
				failed("spend policies ("+pd.Decider+")", err)
			}
			out.Stop = max(out.Stop, scope)
			out.DenyAdmission = out.DenyAdmission || pd.DenyAdmission
		}
	}
	if d.Plugins == nil {
		return out
	}
	// A figure of the project or of an end user, never of one session: no "session".
	raw, err := plugins.SpendInput(in.Project, nil, plugins.Spend{Scope: in.Scope.String(), EndUserID: in.EndUserID,
		Level: in.Level.String(), SpendMicroUSD: in.SpendMicroUSD, CapMicroUSD: in.CapMicroUSD, Month: in.Month}, d.now()).Marshal()
	if err != nil {
		failed("spend plugins", err)
		return out
	}
	pds, err := d.Plugins.Decide(ctx, in.Project, session.PointSpend, raw)
	if err != nil {
		failed("spend plugins", err)
	}
	for _, pd := range pds { // the decisions made before an error still count
		out.Warnings = append(out.Warnings, pd.Warnings...)
		if !pd.Allow {
			out.Stop, out.DenyAdmission = max(out.Stop, in.Scope), true
			out.Warnings = append(out.Warnings, pd.Reasons...)
		}
	}
	return out
}
