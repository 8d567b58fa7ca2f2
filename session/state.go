package session

import (
	"encoding/json"
	"fmt"
)

// State is one of the nine states of a session (seed 000, table "States").
type State string

const (
	Pending      State = "pending"
	Provisioning State = "provisioning"
	Running      State = "running"
	Paused       State = "paused"
	Snapshotting State = "snapshotting"
	Stopping     State = "stopping"
	Stopped      State = "stopped"
	Failed       State = "failed"
	Expired      State = "expired"
)

// Billing is the seed's "Billed" column.
type Billing string

const (
	BilledNo          Billing = "no"
	BilledYes         Billing = "yes"
	BilledStorageOnly Billing = "storage_only"      // paused: paused_gib_month on memory and disk
	BilledUntilMeter  Billing = "until_final_meter" // stopping: session_s until the final meter
)

type stateInfo struct {
	billing  Billing
	terminal bool
	meaning  string
}

var states = map[State]stateInfo{
	Pending:      {BilledNo, false, "Admitted and queued; normally under 10 ms"},
	Provisioning: {BilledNo, false, "Claiming a pool instance or cold starting"},
	Running:      {BilledYes, false, "Executing; session_s accrues every second"},
	Paused:       {BilledStorageOnly, false, "Memory and disk retained, no CPU"},
	Snapshotting: {BilledYes, false, "Still running; the snapshot is taken live"},
	Stopping:     {BilledUntilMeter, false, "Draining, optional final snapshot, teardown"},
	Stopped:      {BilledNo, true, "Terminal, clean"},
	Failed:       {BilledNo, true, "Terminal, unclean"},
	Expired:      {BilledNo, true, "Terminal; maximum lifetime reached"},
}

// States lists every state in the seed's order.
func States() []State {
	return []State{Pending, Provisioning, Running, Paused, Snapshotting, Stopping, Stopped, Failed, Expired}
}

// ParseState returns the state named s, or a *FieldError naming field.
func ParseState(field, s string) (State, error) {
	if _, ok := states[State(s)]; !ok {
		return "", &FieldError{Field: field, Message: fmt.Sprintf("unknown state %q; expected one of %v", s, States())}
	}
	return State(s), nil
}

// Valid reports whether s is one of the nine states.
func (s State) Valid() bool { _, ok := states[s]; return ok }

// Billing is what the state bills (the seed's "Billed" column).
func (s State) Billing() Billing { return states[s].billing }

// BillsSessionSeconds reports whether tierN.session_s accrues in this state.
func (s State) BillsSessionSeconds() bool {
	b := states[s].billing
	return b == BilledYes || b == BilledUntilMeter
}

// Terminal reports whether s is stopped, failed or expired.
func (s State) Terminal() bool { return states[s].terminal }

// Meaning is the seed's one-line description of the state.
func (s State) Meaning() string { return states[s].meaning }

// UnmarshalJSON rejects unknown states.
func (s *State) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return &FieldError{Field: "state", Message: "must be a string"}
	}
	v, err := ParseState("state", str)
	if err != nil {
		return err
	}
	*s = v
	return nil
}
