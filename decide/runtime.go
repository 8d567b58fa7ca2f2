package decide

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"wb/plugins"
	"wb/session"
)

// Session is what the runtime and spend points know of a session.
type Session struct {
	ID        string
	Project   string
	PolicyID  string // pinned runtime policy, pol_NAME@N; "" for none
	EndUserID string
	Tier      int
}

// EventType and Event are the guest events the nodes report (session.GuestEvent).
type (
	EventType = session.GuestEventType
	Event     = session.GuestEvent
)

// The event types the nodes report.
const (
	EventExec           = session.GuestExec
	EventProcessStart   = session.GuestProcessStart
	EventEgress         = session.GuestEgress
	EventResourceSample = session.GuestResourceSample
)

// eventFields is the event as the deciders read it (policies/runtime.rego's input,
// plugins/ABI.md's event.data): "type" and the fields of its type.
func eventFields(e Event) map[string]any {
	m := map[string]any{"type": string(e.Type)}
	switch e.Type {
	case EventExec, EventProcessStart:
		argv := make([]any, len(e.Argv))
		for i, a := range e.Argv {
			argv[i] = a
		}
		m["argv"] = argv
		if e.PTY {
			m["pty"] = true
		}
		if e.Type == EventProcessStart {
			m["pid"] = e.PID
		}
	case EventEgress:
		m["host"], m["port"] = e.Host, e.Port
		if len(e.Addresses) > 0 {
			addrs := make([]any, len(e.Addresses))
			for i, a := range e.Addresses {
				addrs[i] = a
			}
			m["addresses"] = addrs
		}
	case EventResourceSample:
		m["cpu_ms"], m["interval_ms"], m["memory_bytes"] = e.CPUMs, e.IntervalMs, e.MemoryBytes
	}
	return m
}

// RuntimeInput is one event of a running session.
type RuntimeInput struct {
	Session Session
	Event   Event
}

// regoInput is policies/runtime.rego's input: the event's fields plus "session".
func (in RuntimeInput) regoInput() map[string]any {
	m := eventFields(in.Event)
	s := map[string]any{"id": in.Session.ID, "tier": in.Session.Tier}
	if in.Session.EndUserID != "" {
		s["end_user_id"] = in.Session.EndUserID
	}
	if in.Session.PolicyID != "" {
		s["policy_id"] = in.Session.PolicyID
	}
	m["session"] = s
	return m
}

// RuntimeVerdict is the runtime point's answer about one event.
type RuntimeVerdict struct {
	// Kill: stop the session (stop reason policy_violation) naming Rule.
	Kill bool
	Rule string
	// Refuse: the event may not happen (no exec, no egress), but the session goes on: a
	// project's decider could not answer.
	Refuse bool
	Reason string // why a plugin killed, or why the event is refused
	// AllowEgress: an egress event may go out (default: it may not).
	AllowEgress bool
	Warnings    []string
	Decider     string
}

// Runtime is the runtime point: the platform's rules and the session's pinned policy, then the
// project's runtime plugins; any kill wins. It answers an error only when the platform's own
// rules could not decide; the caller refuses the event then (fail closed).
func (d Decider) Runtime(ctx context.Context, in RuntimeInput) (RuntimeVerdict, error) {
	var v RuntimeVerdict
	if d.Policies != nil {
		rd, err := d.Policies.Runtime(ctx, in.Session.Project, in.Session.PolicyID, in.regoInput())
		if err != nil {
			return RuntimeVerdict{}, fmt.Errorf("runtime policies: %w", err)
		}
		v.Warnings, v.Decider = slices.Clone(rd.Warnings), rd.Decider
		switch {
		case rd.Kill: // the platform's kill stands whatever the project's deciders say
			v.Kill, v.Rule = true, rd.Rule
			return v, nil
		case rd.Deny:
			v.Refuse, v.Reason = true, rd.DenyReason
			return v, nil
		}
		v.AllowEgress = rd.AllowEgress
	}
	if d.Plugins == nil {
		return v, nil
	}
	refuse := func(format string, args ...any) (RuntimeVerdict, error) {
		v.Refuse, v.Reason, v.AllowEgress = true, fmt.Sprintf(format, args...), false
		d.log().WarnContext(ctx, "decide: runtime plugins could not decide; the event is refused",
			"project", in.Session.Project, "session", in.Session.ID, "reason", v.Reason)
		return v, nil
	}
	now := d.now()
	input, err := plugins.Runtime(in.Session.Project, in.Session.plugins(),
		plugins.RuntimeEvent{Type: string(in.Event.Type), AtMs: now.UnixMilli(), Data: eventFields(in.Event)}, now).Marshal()
	if err != nil {
		return refuse("the runtime plugins' input: %v", err)
	}
	pds, err := d.Plugins.Decide(ctx, in.Session.Project, session.PointRuntime, input)
	if err != nil {
		return refuse("runtime plugins: %v", err)
	}
	for _, pd := range pds {
		v.Warnings = append(v.Warnings, pd.Warnings...)
		if !pd.Allow && !v.Kill {
			v.Kill, v.Rule, v.Decider, v.AllowEgress = true, pd.Decider, pd.Decider, false
			v.Reason = strings.Join(pd.Reasons, "; ")
		}
	}
	return v, nil
}

// plugins is the session object a runtime or spend plugin receives.
func (s Session) plugins() *session.Session {
	out := &session.Session{ID: s.ID, Object: session.ObjectName, ProjectID: s.Project, Tier: s.Tier}
	if s.EndUserID != "" {
		out.EndUserID = &s.EndUserID
	}
	if s.PolicyID != "" {
		out.PolicyID = &s.PolicyID
	}
	return out
}
