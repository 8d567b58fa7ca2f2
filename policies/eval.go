package policies

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"

	"wb/internal/logbudget"
	"wb/session"
)

// Engine is the gateway's admission decision point.
var _ session.Admitter = (*Engine)(nil)

// RuntimeDecision answers one guest event.
type RuntimeDecision struct {
	// Kill: stop the session with reason policy_violation and Rule.
	Kill    bool   `json:"kill"`
	Rule    string `json:"rule,omitempty"`
	Message string `json:"message,omitempty"`
	// AllowEgress: let an egress event through (default false).
	AllowEgress bool `json:"allow_egress"`
	// Deny: the session's project policy could not answer (missing, failing or out of time),
	// so the event is refused: no egress, no exec. The session is not killed for it; a kill
	// by the platform's rules stands beside it.
	Deny       bool   `json:"deny,omitempty"`
	DenyReason string `json:"deny_reason,omitempty"`
	// Warnings: kills downgraded by warn mode.
	Warnings []string `json:"warnings,omitempty"`
	Decider  string   `json:"decider,omitempty"`
}

// SpendDecision answers one spend update.
type SpendDecision struct {
	// StopScope is "project", "end_user" or "" (nothing to stop).
	StopScope     string   `json:"stop_scope,omitempty"`
	DenyAdmission bool     `json:"deny_admission"`
	Warnings      []string `json:"warnings,omitempty"`
	Decider       string   `json:"decider,omitempty"`
}

// Stop scopes of the spend point.
const (
	ScopeProject = "project"
	ScopeEndUser = "end_user"
)

// evaluation is one decision in progress: its input, converted once, and what each policy
// did.
type evaluation struct {
	e        *Engine
	project  string
	point    string
	start    time.Time
	input    ast.Value
	outcomes []Outcome
	masked   [][]string
	// interrupt stops the decision's queries when the caller's context ends or, once a
	// project policy runs, when Options.EvalTimeout passes. It replaces OPA's goroutine per
	// query that watches the context.
	interrupt topdown.Cancel
	stops     []func() bool
	release   context.CancelFunc
	// slot is the project's evaluation slot this decision holds, if any.
	slot chan struct{}
}

func (e *Engine) begin(ctx context.Context, project, point string, input ast.Value) *evaluation {
	c := topdown.NewCancel()
	return &evaluation{e: e, project: project, point: point, start: time.Now(), input: input,
		interrupt: c, stops: []func() bool{context.AfterFunc(ctx, c.Cancel)}}
}

// done releases the decision's context hooks.
func (ev *evaluation) done() {
	for _, stop := range ev.stops {
		stop()
	}
	if ev.release != nil {
		ev.release()
	}
	if ev.slot != nil {
		<-ev.slot
	}
}

// warnFailed logs msg (with args) about a policy of project's that could not be used, within
// the project's budget of such lines: a policy may fail at every event its tenant's guests
// cause (every exec and egress attempt, thousands a second), and the operator's log is shared.
func (e *Engine) warnFailed(ctx context.Context, project, msg string, args ...any) {
	ok, dropped := e.failLogs.Take(project, time.Now())
	if dropped > 0 {
		e.log.WarnContext(ctx, "policies: a project's policies fail more often than the log's budget; lines of their failures were dropped",
			"project", project, "dropped", dropped, "budget", logbudget.Limits())
	}
	if ok {
		e.log.WarnContext(ctx, msg, append([]any{"project", project}, args...)...)
	}
}

// projectSlots answers the semaphore of a project's evaluations.
func (e *Engine) projectSlots(project string) chan struct{} {
	if s, ok := e.slots.Load(project); ok {
		return s.(chan struct{})
	}
	s, _ := e.slots.LoadOrStore(project, make(chan struct{}, max(e.evalSlots, 1)))
	return s.(chan struct{})
}

// eval runs p's query on the decision's input and answers its package document. Project
// policies run under Options.EvalTimeout; the shipped ones are trusted and bounded.
func (ev *evaluation) eval(ctx context.Context, p *policy) (map[string]any, error) {
	ev.masked = append(ev.masked, p.Masked)
	if p.err != nil {
		return nil, p.err
	}
	if p.ID != shippedID && ev.release == nil {
		var bounded context.Context
		bounded, ev.release = context.WithTimeout(ctx, ev.e.evalTimeout)
		ev.stops = append(ev.stops, context.AfterFunc(bounded, ev.interrupt.Cancel))
		// A project's policies run a few decisions at a time, so that its decisions
		// together stay within a few EvalMemory budgets however many arrive at once.
		slots := ev.e.projectSlots(ev.project)
		select {
		case slots <- struct{}{}:
			ev.slot = slots
		case <-bounded.Done():
			ev.slot = nil
		}
	}
	if p.ID != shippedID && ev.slot == nil {
		return nil, fmt.Errorf("project %s has %d decisions evaluating its policies already; none ended within %v",
			ev.project, cap(ev.e.projectSlots(ev.project)), ev.e.evalTimeout)
	}
	rs, err := p.pq.Eval(withBudget(ctx, ev.e.evalMemory), rego.EvalParsedInput(ev.input), rego.EvalExternalCancel(ev.interrupt),
		rego.EvalMetrics(metrics.NoOp()))
	if err != nil {
		return nil, &evalError{msg: unbounded(err.Error()), err: err}
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return map[string]any{}, nil
	}
	doc, _ := rs[0].Expressions[0].Value.(map[string]any)
	return doc, nil
}

// evalError is an evaluation's error as the policy's author wrote the calls (bounded builtins
// under their own names).
type evalError struct {
	msg string
	err error
}

func (e *evalError) Error() string { return e.msg }
func (e *evalError) Unwrap() error { return e.err }

func (ev *evaluation) record(p *policy, outcome string) {
	ev.outcomes = append(ev.outcomes, Outcome{Policy: p.ID, Mode: p.Mode, Outcome: outcome})
}

// finish hands the decision to the log. result must not share anything the caller may
// change: it is encoded later, by the log's writer.
func (ev *evaluation) finish(outcome string, result any) {
	ev.e.dlog.add(&entry{
		at: ev.start, project: ev.project, point: ev.point, outcome: outcome, policies: ev.outcomes,
		input: ev.input, masked: maskedOf(ev.masked...), result: result, dur: time.Since(ev.start),
	})
}

// Admit decides a create: the shipped wb.admission and the project's latest admission
// policies, each in its mode. Any enforced deny denies. Warnings and defaults are collected
// from all but dryrun policies; defaults merge into Patch, earlier policies winning
// (the platform first, then the project's by name). A project policy that fails to evaluate
// counts as a deny in enforce mode and as a warning in warn mode; an error is answered only
// when the platform itself cannot decide.
func (e *Engine) Admit(ctx context.Context, in session.AdmissionInput) (session.Decision, error) {
	set, err := e.policySet(ctx, in.ProjectID)
	if err != nil {
		return session.Decision{}, err
	}
	ev := e.begin(ctx, in.ProjectID, PointAdmission, admissionValue(in))
	defer ev.done()

	d := session.Decision{Allow: true}
	var deniers, all, softened []string
	for _, p := range append([]*policy{e.shipped[PointAdmission]}, set.byPoint[PointAdmission]...) {
		all = append(all, p.decider())
		doc, err := ev.eval(ctx, p)
		if err != nil {
			if p.ID == shippedID {
				return session.Decision{}, fmt.Errorf("policies: platform admission: %w", err)
			}
			doc = map[string]any{"deny": []any{"evaluation failed: " + err.Error()}}
			e.warnFailed(ctx, in.ProjectID, "policies: policy evaluation failed", "policy", p.ID, "err", err)
		}
		deny, warn := messages(doc["deny"]), messages(doc["warn"])
		outcome := "allow"
		switch p.Mode {
		case ModeEnforce:
			if len(deny) > 0 {
				d.Allow = false
				d.Reasons = append(d.Reasons, prefixed(p, "", deny)...)
				deniers = append(deniers, p.decider())
				outcome = "deny"
			}
		case ModeWarn:
			if len(deny) > 0 {
				d.Warnings = append(d.Warnings, prefixed(p, "warn mode, would deny: ", deny)...)
				softened = append(softened, p.ID)
				outcome = "would deny"
			}
		case ModeDryrun:
			if len(deny) > 0 {
				softened = append(softened, p.ID)
				outcome = "would deny"
			}
			ev.record(p, outcome)
			continue
		}
		d.Warnings = append(d.Warnings, prefixed(p, "", warn)...)
		if defaults, ok := doc["defaults"].(map[string]any); ok && len(defaults) > 0 {
			if d.Patch == nil {
				d.Patch = map[string]any{}
			}
			mergeDefaults(d.Patch, defaults)
		}
		ev.record(p, outcome)
	}
	if d.Allow {
		d.Decider = strings.Join(all, ", ")
	} else {
		d.Decider = strings.Join(deniers, ", ")
	}
	outcome := "deny"
	if d.Allow {
		outcome = "allow"
	}
	if len(softened) > 0 {
		outcome += "; would deny: " + strings.Join(softened, ", ")
	}
	logged := d
	logged.Reasons, logged.Warnings, logged.Patch = slices.Clone(d.Reasons), slices.Clone(d.Warnings), deepCopy(d.Patch)
	ev.finish(outcome, logged)
	return d, nil
}

// Runtime decides one guest event: the shipped wb.runtime first, on its own, then, when
// policyID is set, that exact version of the project's runtime policy (pol_NAME@N, pinned for
// the session's life). event is the event object ({"type": "exec", "argv": [...]} …) with
// its "session".
//
// The platform's rules always apply: a kill they answer stands whatever the project's policy
// does. A project policy that cannot answer (it is missing, does not compile, fails or runs out
// of time) fails closed in enforce mode: the decision has Deny set and the event is refused
// (no egress, no exec), though the session is not killed for it. An error is answered only
// when the platform's own rules cannot decide; the caller must then refuse the event too.
func (e *Engine) Runtime(ctx context.Context, project, policyID string, event map[string]any) (RuntimeDecision, error) {
	if err := validProject(project); err != nil {
		return RuntimeDecision{}, err
	}
	if event == nil {
		event = map[string]any{}
	}
	input, err := ast.InterfaceToValue(event)
	if err != nil {
		return RuntimeDecision{}, fmt.Errorf("policies: runtime event: %w", err)
	}
	ev := e.begin(ctx, project, PointRuntime, input)
	defer ev.done()

	var d RuntimeDecision
	allow := false
	var deciders []string
	platform := e.shipped[PointRuntime]
	ps := []*policy{platform}
	key := ""
	if platform.deterministic {
		key = memoKey(event)
	}
	doc, err := ev.evalRemembered(ctx, platform, &e.runtimeMemo, key)
	if err != nil {
		return RuntimeDecision{}, fmt.Errorf("policies: platform runtime: %w", err)
	}
	docs := []map[string]any{doc}
	if policyID != "" {
		p, err := e.pinned(ctx, project, policyID)
		if err == nil && p.Point != PointRuntime {
			err = fmt.Errorf("%w: %s is a %s policy, not a runtime one", ErrInvalid, policyID, p.Point)
		}
		if err != nil {
			// The session's policy cannot be found: nothing it would allow is allowed.
			d.Deny, d.DenyReason = true, fmt.Sprintf("the session's policy %s cannot be used: %v", policyID, err)
			ev.outcomes = append(ev.outcomes, Outcome{Policy: policyID, Mode: ModeEnforce, Outcome: "error"})
			e.warnFailed(ctx, project, "policies: pinned runtime policy unavailable", "policy", policyID, "err", err)
		} else {
			doc, err := ev.eval(ctx, p)
			if err != nil {
				e.warnFailed(ctx, project, "policies: policy evaluation failed", "policy", p.ID, "err", err)
				doc = nil
				switch p.Mode {
				case ModeEnforce:
					d.Deny, d.DenyReason = true, fmt.Sprintf("%s: evaluation failed, so the event is refused: %v", p.ID, err)
				case ModeWarn:
					d.Warnings = append(d.Warnings, fmt.Sprintf("%s (warn mode, would refuse the event): evaluation failed: %v", p.ID, err))
				}
			}
			ps, docs = append(ps, p), append(docs, doc)
		}
	}
	for i, p := range ps {
		doc := docs[i]
		if doc == nil {
			ev.record(p, "error")
			continue
		}
		kills := killRules(doc["kill"])
		egress := doc["allow_egress"] == true
		outcome := "allow"
		switch {
		case len(kills) > 0 && p.Mode == ModeEnforce:
			outcome = "kill " + kills[0].rule
			if !d.Kill {
				d.Kill, d.Rule, d.Message = true, kills[0].rule, kills[0].message
				deciders = append(deciders, p.decider())
			}
		case len(kills) > 0 && p.Mode == ModeWarn:
			outcome = "would kill " + kills[0].rule
			for _, k := range kills {
				d.Warnings = append(d.Warnings, fmt.Sprintf("%s (warn mode, would kill %s): %s", p.ID, k.rule, k.message))
			}
		case len(kills) > 0:
			outcome = "would kill " + kills[0].rule
		}
		if egress {
			if p.Mode == ModeDryrun {
				outcome += "; would allow egress"
			} else {
				allow = true
				outcome += "; allow egress"
			}
		}
		ev.record(p, outcome)
	}
	d.AllowEgress = allow && !d.Kill && !d.Deny
	if !d.Kill {
		for _, p := range ps {
			deciders = append(deciders, p.decider())
		}
	}
	d.Decider = strings.Join(deciders, ", ")
	outcome := "allow"
	switch {
	case d.Kill:
		outcome = "kill " + d.Rule
	case d.Deny:
		outcome = "deny: " + d.DenyReason
	case d.AllowEgress:
		outcome = "allow egress"
	}
	logged := d
	logged.Warnings = slices.Clone(d.Warnings)
	ev.finish(outcome, logged)
	return d, nil
}

// Spend decides one spend update: the shipped wb.spend and the project's latest spend
// policies, each in its mode. The widest enforced stop scope wins (project over end_user).
func (e *Engine) Spend(ctx context.Context, project string, in map[string]any) (SpendDecision, error) {
	set, err := e.policySet(ctx, project)
	if err != nil {
		return SpendDecision{}, err
	}
	if in == nil {
		in = map[string]any{}
	}
	input, err := ast.InterfaceToValue(in)
	if err != nil {
		return SpendDecision{}, fmt.Errorf("policies: spend input: %w", err)
	}
	ev := e.begin(ctx, project, PointSpend, input)
	defer ev.done()

	var d SpendDecision
	var deciders, all []string
	for _, p := range append([]*policy{e.shipped[PointSpend]}, set.byPoint[PointSpend]...) {
		all = append(all, p.decider())
		doc, err := ev.eval(ctx, p)
		if err != nil {
			if p.ID == shippedID {
				return SpendDecision{}, fmt.Errorf("policies: platform spend: %w", err)
			}
			e.warnFailed(ctx, project, "policies: policy evaluation failed", "policy", p.ID, "err", err)
			d.Warnings = append(d.Warnings, p.ID+": evaluation failed: "+err.Error())
			ev.record(p, "error")
			continue
		}
		scope, _ := doc["stop_sessions"].(string)
		if scope != ScopeProject && scope != ScopeEndUser {
			scope = ""
		}
		denyAdm := doc["deny_admission"] == true
		warn := messages(doc["warn"])
		var acts []string
		if scope != "" {
			acts = append(acts, "stop "+scope)
		}
		if denyAdm {
			acts = append(acts, "deny admission")
		}
		outcome := "allow"
		switch p.Mode {
		case ModeEnforce:
			if len(acts) > 0 {
				outcome = strings.Join(acts, ", ")
				deciders = append(deciders, p.decider())
			}
			d.StopScope = max(d.StopScope, scope) // "project" > "end_user" > ""
			d.DenyAdmission = d.DenyAdmission || denyAdm
			d.Warnings = append(d.Warnings, prefixed(p, "", warn)...)
		case ModeWarn:
			d.Warnings = append(d.Warnings, prefixed(p, "", warn)...)
			if len(acts) > 0 {
				outcome = "would " + strings.Join(acts, ", ")
				d.Warnings = append(d.Warnings, prefixed(p, "", []string{"warn mode, would " + strings.Join(acts, ", ")})...)
			}
		case ModeDryrun:
			if len(acts) > 0 {
				outcome = "would " + strings.Join(acts, ", ")
			}
		}
		ev.record(p, outcome)
	}
	if len(deciders) > 0 {
		d.Decider = strings.Join(deciders, ", ")
	} else {
		d.Decider = strings.Join(all, ", ")
	}
	var acts []string
	if d.StopScope != "" {
		acts = append(acts, "stop "+d.StopScope)
	}
	if d.DenyAdmission {
		acts = append(acts, "deny admission")
	}
	outcome := "allow"
	if len(acts) > 0 {
		outcome = strings.Join(acts, ", ")
	}
	logged := d
	logged.Warnings = slices.Clone(d.Warnings)
	ev.finish(outcome, logged)
	return d, nil
}

// prefixed names a project policy in front of its messages; the platform's go as they are.
func prefixed(p *policy, note string, msgs []string) []string {
	if p.ID == shippedID && note == "" {
		return msgs
	}
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = p.ID + ": " + note + m
	}
	return out
}

// Bounds on what one policy's deny or warn says: the answer and the decision log carry them.
const (
	maxMessages     = 64
	maxMessageBytes = 1024
)

// messages reads a deny or warn value: a set or array of strings (other elements are
// written as JSON), a single string, true, or an object (its "key: value" pairs). It keeps
// the first maxMessages, each cut to maxMessageBytes, and says how many more there were.
func messages(v any) []string {
	out := allMessages(v)
	more := len(out) - maxMessages
	if more > 0 {
		out = append(out[:maxMessages:maxMessages], fmt.Sprintf("… and %d more", more))
	}
	for i, m := range out {
		out[i] = clip(m, maxMessageBytes)
	}
	return out
}

// clip cuts s to at most n bytes (on a rune boundary), marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func allMessages(v any) []string {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return []string{x}
	case bool:
		if x {
			return []string{"denied"}
		}
		return nil
	case []any:
		out := make([]string, 0, len(x))
		for _, m := range x {
			out = append(out, text(m))
		}
		return out
	case map[string]any:
		out := make([]string, 0, len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) {
			out = append(out, k+": "+text(x[k]))
		}
		return out
	default:
		return []string{text(x)}
	}
}

func text(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

type killRule struct{ rule, message string }

// killRules reads kill: an object rule → message, or a set of rule names; sorted by rule.
func killRules(v any) []killRule {
	var out []killRule
	switch x := v.(type) {
	case map[string]any:
		for k, m := range x {
			msg := text(m)
			if m == true {
				msg = k
			}
			out = append(out, killRule{k, msg})
		}
	case []any:
		for _, r := range x {
			out = append(out, killRule{text(r), text(r)})
		}
	case string:
		out = append(out, killRule{x, x})
	case bool:
		if x {
			out = append(out, killRule{"kill", "kill"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rule < out[j].rule })
	for i := range out { // a rule's name is stored with the session that it stops
		out[i].rule, out[i].message = clip(out[i].rule, 128), clip(out[i].message, maxMessageBytes)
	}
	return out
}

// mergeDefaults adds src's fields to dst where dst has none, recursing into objects.
func mergeDefaults(dst, src map[string]any) {
	for k, v := range src {
		cur, ok := dst[k]
		if !ok {
			dst[k] = v
			continue
		}
		cm, ok1 := cur.(map[string]any)
		vm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			mergeDefaults(cm, vm)
		}
	}
}

// deepCopy copies a JSON object (maps, slices, scalars).
func deepCopy(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = copyJSON(v)
	}
	return out
}

func copyJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		return deepCopy(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = copyJSON(e)
		}
		return out
	default:
		return v
	}
}
