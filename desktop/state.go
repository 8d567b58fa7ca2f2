package desktop

import (
	"encoding/json"
	"fmt"

	"wb/session"
)

// State is one of the six states of a desktop (seed 001, table "Session lifecycle").
type State string

const (
	Starting State = "starting"
	Running  State = "running"
	Stopping State = "stopping"
	Asleep   State = "asleep"
	Stopped  State = "stopped"
	Failed   State = "failed"
)

type stateInfo struct {
	meaning, compute, mcp string
}

var states = map[State]stateInfo{
	Starting: {"The desktop is starting or waking", "Starting", "Waits until it runs, then answers"},
	Running:  {"The desktop is up", "In use", "Answers"},
	Stopping: {"The desktop is shutting down, after a sleep, a stop or a delete", "Releasing", "Depends on what it becomes"},
	Asleep:   {"You chose Sleep, or it was idle for 15 minutes. Disk and snapshot kept", "None", "Wakes it, waits, then answers"},
	Stopped:  {"You chose Stop. Disk kept, no snapshot", "None", "Fails with 409"},
	Failed:   {"The desktop could not start. message says why", "None", "Fails with 502"},
}

// States lists every state in the seed's order.
func States() []State { return []State{Starting, Running, Stopping, Asleep, Stopped, Failed} }

// Valid reports whether s is one of the six states.
func (s State) Valid() bool { _, ok := states[s]; return ok }

// Meaning is the seed's description of the state.
func (s State) Meaning() string { return states[s].meaning }

// Compute is the seed's "Compute" column: whether the state holds a running guest.
func (s State) Compute() string { return states[s].compute }

// Awake reports whether a session runs (or is being made to run) for the desktop.
func (s State) Awake() bool { return s == Starting || s == Running }

// MCPStatus is what an MCP tool call to a desktop in this state answers before it runs (the
// seed's "What an MCP call does"): 0 when the call proceeds (perhaps after a wake and a wait),
// 409 for a stopped desktop, 502 for a failed one.
func (s State) MCPStatus() int {
	switch s {
	case Stopped:
		return 409
	case Failed:
		return 502
	}
	return 0
}

// ParseState answers the state named s, or a *FieldError naming field.
func ParseState(field, s string) (State, error) {
	if !State(s).Valid() {
		return "", &session.FieldError{Field: field, Message: fmt.Sprintf("unknown state %q; expected one of %v", s, States())}
	}
	return State(s), nil
}

// UnmarshalJSON rejects unknown states.
func (s *State) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return &session.FieldError{Field: "state", Message: "must be a string"}
	}
	v, err := ParseState("state", str)
	if err != nil {
		return err
	}
	*s = v
	return nil
}
