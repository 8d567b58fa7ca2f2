package session

import (
	"fmt"
	"slices"
	"strings"
)

// Rule is one row of the transition table: the driver allowed to move a session From → To,
// and the reasons that driver may give (none for transitions that carry no reason).
// From is "" for creation (→ pending).
type Rule struct {
	From, To State
	Driver   Driver
	Reasons  []Reason
	// Seed is true for rows taken from seed 000's table. The others are additions the seed's
	// failure table and timers imply (for instance a host failure leaves nobody to drain, so
	// it goes straight to failed); each says why in Note.
	Seed bool
	Note string
}

// rules is the transition table. Each (From, To, Reason) has exactly one driver.
var rules = []Rule{
	{From: "", To: Pending, Driver: APIGateway, Seed: true, Note: "after admission; concurrency slot reserved here"},
	{From: Pending, To: Provisioning, Driver: Placer, Seed: true, Note: "placement decision recorded"},
	{From: Provisioning, To: Running, Driver: Node, Seed: true, Note: "health probe; webhook session.running"},
	{From: Provisioning, To: Failed, Driver: Node, Reasons: []Reason{StartFailure, OOM}, Seed: true, Note: "the guest could not start"},
	{From: Provisioning, To: Failed, Driver: Timer, Reasons: []Reason{ProvisionTimeout}, Seed: true, Note: "deadline: 3 × the tier's cold p95"},
	{From: Running, To: Paused, Driver: Caller, Seed: true, Note: "POST :pause; tiers 2–4 only"},
	{From: Paused, To: Running, Driver: Caller, Seed: true, Note: "POST :resume"},
	{From: Running, To: Snapshotting, Driver: Caller, Seed: true, Note: "POST :snapshot"},
	{From: Snapshotting, To: Running, Driver: Caller, Seed: true, Note: "POST :snapshot, when the snapshot is taken"},
	{From: Running, To: Stopping, Driver: Caller, Reasons: []Reason{Deleted}, Seed: true, Note: "DELETE"},
	{From: Running, To: Stopping, Driver: Timer, Reasons: []Reason{IdleTimeout, MaxLifetime}, Seed: true, Note: "node-enforced timers"},
	{From: Running, To: Stopping, Driver: Placer, Reasons: []Reason{Eviction}, Seed: true, Note: "host drained"},
	{From: Running, To: Stopping, Driver: Policy, Reasons: []Reason{PolicyViolation}, Seed: true, Note: "runtime policy kill"},
	{From: Running, To: Stopping, Driver: Metering, Reasons: []Reason{SpendCap}, Seed: true, Note: "spend cap"},
	{From: Stopping, To: Stopped, Driver: Node, Reasons: []Reason{Deleted, IdleTimeout, SpendCap, Eviction}, Seed: true, Note: "final usage flush, slot released, pool refilled"},
	{From: Stopping, To: Failed, Driver: Node, Reasons: []Reason{PolicyViolation}, Seed: true, Note: "final usage flush, slot released, pool refilled"},

	// Additions implied by the seed's failure table and timers.
	{From: Stopping, To: Expired, Driver: Node, Reasons: []Reason{MaxLifetime}, Note: "failure table: maximum lifetime reached → expired"},
	{From: Running, To: Failed, Driver: Node, Reasons: []Reason{OOM, GuestCrash}, Note: "failure table: guest OOM → failed; likewise a guest that died by its own doing while its host works (guest_crash); the guest is already dead, nothing to drain"},
	{From: Pending, To: Failed, Driver: Timer, Reasons: []Reason{ProvisionTimeout}, Note: "the provisioning deadline also covers a session no node took"},
	{From: Pending, To: Stopped, Driver: Caller, Reasons: []Reason{Deleted}, Note: "DELETE before placement: nothing to drain"},
	{From: Provisioning, To: Stopping, Driver: Caller, Reasons: []Reason{Deleted}, Note: "DELETE while provisioning: the node tears down"},
	{From: Paused, To: Stopping, Driver: Caller, Reasons: []Reason{Deleted}, Note: "DELETE while paused"},
	{From: Paused, To: Stopping, Driver: Timer, Reasons: []Reason{IdleTimeout, MaxLifetime}, Note: "paused at most 1 h, then auto-stopped (idle_timeout); lifetime keeps running"},
	{From: Paused, To: Stopping, Driver: Placer, Reasons: []Reason{Eviction}, Note: "a paused guest holds host capacity"},
	{From: Paused, To: Stopping, Driver: Metering, Reasons: []Reason{SpendCap}, Note: "paused bills storage, so a cap stops it too"},
	{From: Paused, To: Stopping, Driver: Policy, Reasons: []Reason{PolicyViolation}, Note: "a paused guest holds host capacity: its node stops one that holds the most of the host's guests' process total (host_process_share), as it would a running one"},
	{From: Pending, To: Stopped, Driver: Metering, Reasons: []Reason{SpendCap}, Note: "a cap crossed before placement: admitted earlier, it would run past the cap"},
	{From: Provisioning, To: Stopping, Driver: Metering, Reasons: []Reason{SpendCap}, Note: "a cap crossed while it starts: the node tears it down"},
	{From: Provisioning, To: Failed, Driver: Placer, Reasons: []Reason{HostFailure}, Note: "failure table: host died; its heartbeat lapsed"},
	{From: Running, To: Failed, Driver: Placer, Reasons: []Reason{HostFailure}, Note: "failure table: host died while running"},
	{From: Paused, To: Failed, Driver: Placer, Reasons: []Reason{HostFailure}, Note: "failure table: host died"},
	{From: Snapshotting, To: Failed, Driver: Placer, Reasons: []Reason{HostFailure}, Note: "failure table: host died"},
	{From: Stopping, To: Failed, Driver: Placer, Reasons: []Reason{HostFailure}, Note: "failure table: host died during teardown"},
}

// Rules returns a copy of the transition table.
func Rules() []Rule {
	out := make([]Rule, len(rules))
	for i, r := range rules {
		r.Reasons = slices.Clone(r.Reasons)
		out[i] = r
	}
	return out
}

// Check reports whether driver may move a session from → to giving reason. It returns a
// *TransitionError (or a *FieldError for unknown names) when not.
func Check(from, to State, driver Driver, reason Reason) error {
	if from != "" && !from.Valid() {
		return &FieldError{Field: "from", Message: fmt.Sprintf("unknown state %q", from)}
	}
	if !to.Valid() {
		return &FieldError{Field: "to", Message: fmt.Sprintf("unknown state %q", to)}
	}
	if _, err := ParseDriver("driver", string(driver)); err != nil {
		return err
	}
	if reason != "" && !reason.Valid() {
		return &FieldError{Field: "reason", Message: fmt.Sprintf("unknown reason %q; expected one of %v", reason, Reasons())}
	}
	terr := &TransitionError{From: from, To: to, Driver: driver, Reason: reason}
	var drivers []string
	for _, r := range rules {
		if r.From != from || r.To != to {
			continue
		}
		if r.Driver != driver {
			drivers = append(drivers, string(r.Driver))
			continue
		}
		if len(r.Reasons) == 0 {
			if reason == "" {
				return nil
			}
			terr.Message = "this transition carries no reason"
			return terr
		}
		if slices.Contains(r.Reasons, reason) {
			return nil
		}
		if reason == "" {
			terr.Message = fmt.Sprintf("a reason is required, one of %v", r.Reasons)
		} else {
			terr.Message = fmt.Sprintf("%s may give only %v here", driver, r.Reasons)
		}
		return terr
	}
	if len(drivers) == 0 {
		terr.Message = "not in the transition table"
	} else {
		terr.Message = "only " + strings.Join(slices.Compact(drivers), " or ") + " may make it"
	}
	return terr
}

// Next returns the state a session in from moves to when driver stops it for reason: stopping
// for states with something to drain, or the terminal state directly where the table says so.
// It returns an error when no such transition exists.
func Next(from State, driver Driver, reason Reason) (State, error) {
	for _, to := range []State{Stopping, reason.Terminal()} {
		if to == "" {
			continue
		}
		if Check(from, to, driver, reason) == nil {
			return to, nil
		}
	}
	return "", &TransitionError{From: from, Driver: driver, Reason: reason,
		Message: fmt.Sprintf("a %s session cannot be stopped for %s by %s", from, reason, driver)}
}

// Event types written to the outbox. The public ones are webhooks (WebhookEventType in
// gateway/openapi.json); the others are internal (placer, metering) and never delivered to
// callers.
const (
	EventPending         = "session.pending"
	EventProvisioning    = "session.provisioning"
	EventRunning         = "session.running"
	EventPaused          = "session.paused"
	EventResumed         = "session.resumed"
	EventSnapshotting    = "session.snapshotting"
	EventSnapshotted     = "session.snapshotted"
	EventStopping        = "session.stopping"
	EventStopped         = "session.stopped"
	EventFailed          = "session.failed"
	EventExpired         = "session.expired"
	EventIdleWarning     = "session.idle_warning"
	EventLifetimeWarning = "session.lifetime_warning"
	EventSnapshotReady   = "snapshot.ready"
	EventRunFinished     = "run.finished"
	EventQuotaExceeded   = "quota.exceeded"
)

// PublicEvents are the webhook event types (WebhookEventType in gateway/openapi.json).
func PublicEvents() []string {
	return []string{EventPending, EventRunning, EventPaused, EventResumed, EventStopping,
		EventStopped, EventFailed, EventExpired, EventIdleWarning, EventLifetimeWarning,
		EventSnapshotReady, EventRunFinished, EventQuotaExceeded}
}

// EventType is the outbox event for a transition from → to.
func EventType(from, to State) string {
	switch to {
	case Pending:
		return EventPending
	case Provisioning:
		return EventProvisioning
	case Running:
		switch from {
		case Paused:
			return EventResumed
		case Snapshotting:
			return EventSnapshotted
		}
		return EventRunning
	case Paused:
		return EventPaused
	case Snapshotting:
		return EventSnapshotting
	case Stopping:
		return EventStopping
	case Stopped:
		return EventStopped
	case Failed:
		return EventFailed
	case Expired:
		return EventExpired
	}
	return ""
}
