package session

import "fmt"

// FieldError is bad input in one named field. Callers answer it as 400 with param = Field.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Message) }

// TransitionError is a transition that the contract does not allow.
type TransitionError struct {
	From, To State
	Driver   Driver
	Reason   Reason
	Message  string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("transition %s → %s by %s (reason %q) not allowed: %s",
		e.From, e.To, e.Driver, e.Reason, e.Message)
}
