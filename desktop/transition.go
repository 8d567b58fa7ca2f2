package desktop

import (
	"fmt"
	"slices"
	"strings"
)

// Cause is what asks a desktop to change state: a caller's request, the service's idle
// timer, an agent's use, or the completion of the work a transition started.
type Cause string

const (
	// Requests (the seed's "Cause" column).
	Create Cause = "create"
	Sleep  Cause = "sleep"  // POST :sleep
	Idle   Cause = "idle"   // N minutes without use (the service)
	Wake   Cause = "wake"   // POST :wake
	MCP    Cause = "mcp"    // an MCP tool call
	File   Cause = "file"   // a file sent, saved or deleted
	Stop   Cause = "stop"   // POST :stop
	Start  Cause = "start"  // POST :start
	Delete Cause = "delete" // DELETE

	// Completions: the work behind a request finished (the seed's "then running" etc.).
	Ready        Cause = "ready"         // the session runs
	StartFailed  Cause = "start_failed"  // the session could not start
	Halted       Cause = "halted"        // the session is down after a sleep or a stop
	SessionEnded Cause = "session_ended" // the session ended on its own (lifetime, crash)
)

// Rule is one row of the transition table: a desktop in one of From moves, for Cause,
// through Via (the seed's "stopping, then asleep": "" when it moves at once) to To.
// To is "" for Delete: the desktop is gone.
type Rule struct {
	From  []State // nil: any state
	Cause Cause
	Via   State
	To    State
	// Seed marks the rows of seed 001's table; the others complete one of them or are
	// additions the seed implies, and say why in Note.
	Seed bool
	Note string
}

var rules = []Rule{
	{From: []State{}, Cause: Create, Via: Starting, To: Running, Seed: true, Note: "a small desktop is ready in seconds (warm pool); a bigger one starts cold"},
	{From: []State{Running}, Cause: Sleep, Via: Stopping, To: Asleep, Seed: true, Note: "memory snapshot, then the session stops"},
	{From: []State{Running}, Cause: Idle, Via: Stopping, To: Asleep, Seed: true, Note: "N minutes without use (15 by default)"},
	{From: []State{Asleep}, Cause: MCP, Via: Starting, To: Running, Seed: true, Note: "a new session restored from the memory snapshot"},
	{From: []State{Asleep}, Cause: Wake, Via: Starting, To: Running, Seed: true},
	{From: []State{Asleep}, Cause: File, Via: Starting, To: Running, Seed: true},
	{From: []State{Running, Starting}, Cause: Stop, Via: Stopping, To: Stopped, Seed: true, Note: "disk snapshot, then the session stops"},
	{From: []State{Asleep}, Cause: Stop, To: Stopped, Seed: true, Note: "the memory snapshot is discarded"},
	{From: []State{Stopped}, Cause: Start, Via: Starting, To: Running, Seed: true, Note: "a fresh start from the disk"},
	{From: nil, Cause: Delete, Seed: true, Note: "session and snapshots removed"},

	// Completions of the rows above.
	{From: []State{Starting}, Cause: Ready, To: Running, Note: "the session runs"},
	{From: []State{Starting}, Cause: StartFailed, To: Failed, Note: "failed: message says why"},
	{From: []State{Stopping}, Cause: Halted, To: Asleep, Note: "after Sleep or idle"},
	{From: []State{Stopping}, Cause: Halted, To: Stopped, Note: "after Stop"},
	// Additions.
	{From: []State{Failed}, Cause: Start, Via: Starting, To: Running, Note: "failed means it could not start: Start tries again, fresh from the disk"},
	{From: []State{Running}, Cause: SessionEnded, To: Stopped, Note: "the session ended under it (its host failed, its guest crashed): what is left is the disk, as after a stop"},
}

// Rules answers a copy of the transition table.
func Rules() []Rule {
	out := make([]Rule, len(rules))
	for i, r := range rules {
		r.From = slices.Clone(r.From)
		out[i] = r
	}
	return out
}

// Applies reports whether the rule moves a desktop in from.
func (r Rule) Applies(from State) bool {
	if r.From == nil {
		return from != ""
	}
	if len(r.From) == 0 {
		return from == ""
	}
	return slices.Contains(r.From, from)
}

// Next answers the state a desktop in from enters at once for cause (Via, or To when the
// move is immediate), and where it ends. A Halted completion needs to know which of asleep
// or stopped the stop was for: use Halt. For a cause the state does not allow, it answers a
// *StateError, which callers answer as 409 naming the state.
func Next(from State, cause Cause) (now, to State, err error) {
	for _, r := range rules {
		if r.Cause != cause || !r.Applies(from) {
			continue
		}
		if r.Via != "" {
			return r.Via, r.To, nil
		}
		return r.To, r.To, nil
	}
	return "", "", &StateError{State: from, Cause: cause, Need: needs(cause)}
}

// Halt checks the completion of a sleep (to asleep) or a stop (to stopped) from stopping.
func Halt(from, to State) error {
	for _, r := range rules {
		if r.Cause == Halted && r.To == to && r.Applies(from) {
			return nil
		}
	}
	return &StateError{State: from, Cause: Halted, Need: []State{Stopping}}
}

// needs answers the states from which cause is allowed.
func needs(cause Cause) []State {
	var out []State
	for _, r := range rules {
		if r.Cause != cause {
			continue
		}
		if r.From == nil {
			return States()
		}
		for _, s := range r.From {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// StateError is a request the desktop's state does not allow. The gateway answers it as
// 409 invalid_state; its message names the state.
type StateError struct {
	State State
	Cause Cause
	Need  []State // the states that would allow it
}

func (e *StateError) Error() string {
	if e.State == "" {
		return fmt.Sprintf("%s needs an existing desktop", e.Cause)
	}
	if len(e.Need) == 0 {
		return fmt.Sprintf("desktop is %s; %s is never allowed", e.State, e.Cause)
	}
	names := make([]string, len(e.Need))
	for i, s := range e.Need {
		names[i] = string(s)
	}
	return fmt.Sprintf("desktop is %s; %s needs it %s", e.State, e.Cause, strings.Join(names, " or "))
}
