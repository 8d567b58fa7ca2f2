package chapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// APIError is an error answer of the VMM: its status and the error chain it sent, outermost
// cause first (e.g. ["Error from API", "The VM could not be paused", …]).
type APIError struct {
	Op     string   // the operation, e.g. "vm.pause"
	Status int      // the HTTP status
	Chain  []string // the server's error chain; empty when it sent none
}

// maxErrorText bounds the message Error returns: the chain comes from the VMM and ends up
// in logs.
const maxErrorText = 2048

func (e *APIError) Error() string {
	msg := fmt.Sprintf("cloud-hypervisor %s: %d %s", e.Op, e.Status, http.StatusText(e.Status))
	if len(e.Chain) > 0 {
		msg += ": " + strings.Join(e.Chain, ": ")
	}
	if len(msg) > maxErrorText {
		cut := maxErrorText
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…"
	}
	return msg
}

func newAPIError(op string, status int, body []byte) *APIError {
	e := &APIError{Op: op, Status: status}
	if len(strings.TrimSpace(string(body))) == 0 {
		return e // the router's bare 400 for a wrong method
	}
	if err := json.Unmarshal(body, &e.Chain); err != nil {
		// Not the server's shape; keep what it said rather than nothing.
		e.Chain = []string{"(not an error chain) " + clip(body, 200)}
	}
	return e
}

func statusOf(err error) int {
	var e *APIError
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// IsWrongState reports whether err is the VMM refusing an operation with 500, which it
// answers when the VM is not in a state that allows the operation (pausing a VM that is
// not running, booting one already booted, …). It answers 500 for internal failures too;
// the chain tells them apart for a human.
func IsWrongState(err error) bool { return statusOf(err) == http.StatusInternalServerError }

// IsNotCreated reports whether err is the VMM answering 404: there is no VM (create or
// restore one first), or no device with the id given.
func IsNotCreated(err error) bool { return statusOf(err) == http.StatusNotFound }

// IsBadConfig reports whether err is the VMM answering 400: the configuration or request
// is invalid.
func IsBadConfig(err error) bool { return statusOf(err) == http.StatusBadRequest }

// IsConflict reports whether err is the VMM answering 409: a device with the same id or
// path exists.
func IsConflict(err error) bool { return statusOf(err) == http.StatusConflict }

// IsBusy reports whether err is the VMM answering 429 to vm.resize: an earlier vCPU
// removal is still pending; try again later.
func IsBusy(err error) bool { return statusOf(err) == http.StatusTooManyRequests }
