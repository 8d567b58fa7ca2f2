package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"wb/agent"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
	"wb/webhooks"
)

// apiError is the API's error body (Error in openapi.json): {"error": {type, code, message, param}}.
type apiError struct {
	Status     int           `json:"-"`
	Type       string        `json:"type"`
	Code       string        `json:"code"`
	Message    string        `json:"message"`
	Param      string        `json:"param,omitempty"`
	RetryAfter time.Duration `json:"-"`
}

func (e *apiError) Error() string { return e.Message }

// errInvalid is a 400 whose message starts with the parameter it is about.
func errInvalid(param, format string, args ...any) *apiError {
	msg := fmt.Sprintf(format, args...)
	if param != "" && !strings.HasPrefix(msg, param) {
		msg = param + ": " + msg
	}
	return &apiError{Status: 400, Type: "invalid_request", Code: "invalid_request", Param: param, Message: msg}
}

func errNotFound(what, id string) *apiError {
	return &apiError{Status: 404, Type: "not_found", Code: "not_found", Message: fmt.Sprintf("no %s %q in this project", what, id)}
}

func errState(format string, args ...any) *apiError {
	return &apiError{Status: 409, Type: "invalid_state", Code: "invalid_state", Message: fmt.Sprintf(format, args...)}
}

// toAPIError maps errors from the layers below to API errors; anything unknown is a 500
// whose details go to the log, not to the caller.
func toAPIError(err error) *apiError {
	var ae *apiError
	var fe *session.FieldError
	var te *session.TransitionError
	var ce *store.ConflictError
	var le *store.ConcurrencyError
	var pe *store.PlanLimitError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &fe):
		return errInvalid(fe.Field, "%s", fe.Error())
	case errors.As(err, &ce):
		return errState("%s", ce.Error())
	case errors.As(err, &te):
		return errState("the session cannot go from %s to %s: %s", te.From, te.To, te.Message)
	case errors.As(err, &pe):
		return errPlanLimit(pe.Field, "%s", pe.Error())
	case errors.As(err, &le):
		return &apiError{Status: 429, Type: "rate_limited", Code: "concurrency_limit", Message: le.Error() + "; stop a session or raise the limit", RetryAfter: time.Second}
	case errors.Is(err, store.ErrNotFound), errors.Is(err, webhooks.ErrNotFound):
		return &apiError{Status: 404, Type: "not_found", Code: "not_found", Message: "no such object in this project"}
	case errors.Is(err, store.ErrIdemMismatch), errors.Is(err, store.ErrIdemInFlight):
		return &apiError{Status: 409, Type: "idempotency_error", Code: "idempotency_key_reused", Message: err.Error()}
	case storeUnavailable(err):
		return &apiError{Status: 503, Type: "api_error", Code: "store_unavailable", RetryAfter: time.Second,
			Message: "the platform's data store is unreachable or failing over; retry shortly (a create with the same Idempotency-Key)"}
	}
	return &apiError{Status: 500, Type: "api_error", Code: "internal", Message: "internal error; it has been logged"}
}

// storeUnavailable: Redis away is the caller's to retry (503), anything else a 500.
func storeUnavailable(err error) bool { return store.Unavailable(err) }

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := toAPIError(err)
	if ae.Status >= 500 {
		s.log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, (ae.RetryAfter+time.Second-1)/time.Second))))
	}
	writeJSON(w, ae.Status, map[string]*apiError{"error": ae})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		slog.Error("encode response", "err", err)
		status, b = 500, []byte(`{"error":{"type":"api_error","code":"internal","message":"could not encode the response"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// Host paths and internal addresses never reach a tenant: a node's or agent's error may name
// the node's directories (/var/lib/wb/...), sockets, or the host:port of a node or Redis.
var (
	internalURL  = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>]+`)
	bracketed    = regexp.MustCompile(`\[[0-9A-Za-z:.%]+\](:\d{1,5})?`)
	ipv6Like     = regexp.MustCompile(`[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f.]*(%[0-9A-Za-z]+)?`)
	internalIPv4 = regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}(:\d{1,5})?\b`)
	internalHost = regexp.MustCompile(`\b[A-Za-z0-9-]*[A-Za-z][A-Za-z0-9-]*(\.[A-Za-z0-9-]+)*:\d{1,5}\b|\blocalhost\b`)
	// A path begins after a space, a quote or a punctuation that opens or lists (Go's %v
	// of a slice is [a b], of a struct {a b}), and ends at one that closes or lists.
	hostPath = regexp.MustCompile("(^|[\\s\"'=(:,\\[{<`;|])/[^\\s\"',;:)\\]}>`|]*")
)

// redactInternal replaces URLs, IP addresses, host:port pairs and absolute paths in msg with
// placeholders, leaving the rest of the message readable.
func redactInternal(msg string) string {
	const addr = "<internal address>"
	msg = internalURL.ReplaceAllString(msg, addr)
	msg = bracketed.ReplaceAllString(msg, addr)
	msg = ipv6Like.ReplaceAllStringFunc(msg, func(m string) string {
		if _, err := netip.ParseAddr(m); err != nil {
			return m
		}
		return addr
	})
	msg = internalIPv4.ReplaceAllString(msg, addr)
	msg = internalHost.ReplaceAllString(msg, addr)
	return hostPath.ReplaceAllString(msg, "$1<host path>")
}

// maxRelayedMessage bounds, in bytes, the message of an error of a node or an agent that a
// tenant is answered (errNode, errUpstream): one may carry KBs of a runtime's output (up to
// the 64 KiB the node client reads), the log keeps it whole, and a failed snapshot keeps the
// message as its failure_reason, answered in every list of the project's snapshots.
const maxRelayedMessage = 1 << 10

// clipMessage answers msg cut to maxRelayedMessage bytes, whole runes, ending "…" when cut.
func clipMessage(msg string) string {
	if len(msg) <= maxRelayedMessage {
		return msg
	}
	cut := maxRelayedMessage - len("…")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// errNode maps a node's refusal to the API error of the same status and code: a 409 (the
// guest's state on the node does not allow it; the message names that state) and a 404 (the
// node holds no guest for the session). Anything else the node answered, and a node that
// could not be reached, is errUpstream's 502 with code.
func (s *Server) errNode(ctx context.Context, code, what string, err error) *apiError {
	switch status, msg := nodeRefusal(err); status {
	case http.StatusConflict:
		return &apiError{Status: 409, Type: "invalid_state", Code: "invalid_state", Message: clipMessage(what + ": " + redactInternal(msg))}
	case http.StatusNotFound:
		return &apiError{Status: 404, Type: "not_found", Code: "not_found", Message: clipMessage(what + ": " + redactInternal(msg))}
	}
	return s.errUpstream(ctx, code, what, err)
}

// nodeRefusal answers the status and message of the node's refusal in err: an answer of its
// API (*nodeapi.Error), or its proxy's answer that the guest is not running there (an
// *agent.Error with the node's invalid_state); 0 for anything else.
func nodeRefusal(err error) (int, string) {
	var ne *nodeapi.Error
	if errors.As(err, &ne) {
		if ne.Code == nodeapi.CodeInvalidState || ne.Code == nodeapi.CodeNotFound {
			return ne.Status, ne.Message
		}
		return 0, ""
	}
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Code == nodeapi.CodeInvalidState {
		return ae.Status, ae.Message
	}
	return 0, ""
}

// errUpstream is a 502 for a failure of the node or the guest's agent: the caller learns what
// failed, with host paths and internal addresses replaced; the log keeps the detail.
func (s *Server) errUpstream(ctx context.Context, code, what string, err error) *apiError {
	s.log.WarnContext(ctx, what, "code", code, "err", err)
	return &apiError{Status: 502, Type: "api_error", Code: code, Message: clipMessage(what + ": " + redactInternal(err.Error()))}
}
