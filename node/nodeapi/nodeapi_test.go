package nodeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestParseError: an error body keeps the node's status, code, message and param, through
// wrapping; anything else (a proxy's page) is an http_error that keeps the status.
func TestParseError(t *testing.T) {
	body, err := json.Marshal(ErrorBody{Error: &Error{Code: CodeInvalidState, Message: "node: session s is paused here", Param: "p"}})
	if err != nil {
		t.Fatal(err)
	}
	wrapped := fmt.Errorf("node n1: %w", ParseError(409, body))
	var e *Error
	if !errors.As(wrapped, &e) || *e != (Error{Status: 409, Code: CodeInvalidState, Message: "node: session s is paused here", Param: "p"}) {
		t.Fatalf("parsed %+v", e)
	}
	if !strings.Contains(wrapped.Error(), "409 invalid_state (p): node: session s is paused here") {
		t.Errorf("message %q: want status, code, param and the node's message", wrapped)
	}
	for _, b := range []string{"<html>bad gateway</html>", "", `{"error":{"message":"no code"}}`} {
		e := ParseError(502, []byte(b))
		if e.Status != 502 || e.Code != CodeHTTPError || !strings.Contains(e.Message, "Bad Gateway") {
			t.Errorf("body %q parsed as %+v", b, e)
		}
	}
}
