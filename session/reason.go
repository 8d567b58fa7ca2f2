package session

import (
	"encoding/json"
	"fmt"
)

// Reason says why a session stopped, expired or failed. It is recorded on the session as
// state_reason and surfaced in webhooks.
type Reason string

const (
	Deleted          Reason = "deleted"
	IdleTimeout      Reason = "idle_timeout"
	MaxLifetime      Reason = "max_lifetime"
	Eviction         Reason = "eviction"
	PolicyViolation  Reason = "policy_violation" // carries the rule's name
	SpendCap         Reason = "spend_cap"
	ProvisionTimeout Reason = "provision_timeout"
	HostFailure      Reason = "host_failure"
	OOM              Reason = "oom"
	StartFailure     Reason = "start_failure"
	// GuestCrash is a guest that died by its own doing (its sandbox gave out under what it
	// ran, e.g. a fork bomb past its limits) while its host kept working; host_failure stays
	// for hosts.
	GuestCrash Reason = "guest_crash"
)

// terminalFor is the terminal state each reason leads to (seed 000, "Failure semantics").
var terminalFor = map[Reason]State{
	Deleted:          Stopped,
	IdleTimeout:      Stopped,
	SpendCap:         Stopped,
	Eviction:         Stopped,
	MaxLifetime:      Expired,
	PolicyViolation:  Failed,
	ProvisionTimeout: Failed,
	HostFailure:      Failed,
	OOM:              Failed,
	StartFailure:     Failed,
	GuestCrash:       Failed,
}

// Reasons lists every reason.
func Reasons() []Reason {
	return []Reason{Deleted, IdleTimeout, MaxLifetime, Eviction, PolicyViolation, SpendCap,
		ProvisionTimeout, HostFailure, OOM, StartFailure, GuestCrash}
}

// ParseReason returns the reason named s, or a *FieldError naming field.
func ParseReason(field, s string) (Reason, error) {
	if _, ok := terminalFor[Reason(s)]; !ok {
		return "", &FieldError{Field: field, Message: fmt.Sprintf("unknown reason %q; expected one of %v", s, Reasons())}
	}
	return Reason(s), nil
}

// Valid reports whether r is a known reason.
func (r Reason) Valid() bool { _, ok := terminalFor[r]; return ok }

// Terminal is the terminal state that r leads to.
func (r Reason) Terminal() State { return terminalFor[r] }

// UnmarshalJSON rejects unknown reasons.
func (r *Reason) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return &FieldError{Field: "state_reason", Message: "must be a string"}
	}
	v, err := ParseReason("state_reason", str)
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Driver is who may make a transition (seed 000, table "Transitions and who drives them").
type Driver string

const (
	APIGateway Driver = "api-gateway" // after admission
	Placer     Driver = "placer"      // placement, node liveness
	Node       Driver = "node"        // wbnode: health probe, teardown, guest failures
	Caller     Driver = "caller"      // the API caller: pause, resume, snapshot, delete
	Timer      Driver = "timer"       // idle, lifetime, pause limit, provisioning deadline
	Metering   Driver = "metering"    // spend caps
	Policy     Driver = "policy"      // runtime policy kills
)

// Drivers lists every driver.
func Drivers() []Driver {
	return []Driver{APIGateway, Placer, Node, Caller, Timer, Metering, Policy}
}

// ParseDriver returns the driver named s, or a *FieldError naming field.
func ParseDriver(field, s string) (Driver, error) {
	for _, d := range Drivers() {
		if string(d) == s {
			return d, nil
		}
	}
	return "", &FieldError{Field: field, Message: fmt.Sprintf("unknown driver %q; expected one of %v", s, Drivers())}
}
