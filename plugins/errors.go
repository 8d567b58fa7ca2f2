package plugins

import (
	"errors"
	"fmt"
)

// ErrNotFound answers Get and Delete of a plugin that does not exist.
var ErrNotFound = errors.New("plugin not found")

// ErrClosed answers every call after Close.
var ErrClosed = errors.New("plugin host closed")

// ValidationError says why a module or an upload was refused (HTTP 400).
type ValidationError struct {
	Reason string
}

func (e *ValidationError) Error() string { return "invalid plugin: " + e.Reason }

func invalid(format string, args ...any) error {
	return &ValidationError{Reason: fmt.Sprintf(format, args...)}
}

// FailureKind classifies a plugin's failure.
type FailureKind string

// Kinds of failure.
const (
	FailTimeout FailureKind = "timeout" // the call's deadline passed
	FailTrap    FailureKind = "trap"    // a Wasm trap, a Go panic, proc_exit
	FailMemory  FailureKind = "memory"  // the memory limit was reached
	FailOutput  FailureKind = "output"  // the result is too big, out of bounds or not a result
	FailStart   FailureKind = "start"   // instantiation or _initialize failed
)

// CallError is one plugin call that failed. Its message is the cause, as Decide puts it into
// the deny reason: "timed out after 20ms".
type CallError struct {
	Kind  FailureKind
	Cause string
}

func (e *CallError) Error() string { return e.Cause }
