package nodeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"wb/session"
)

// Routes, as http.ServeMux patterns, and the paths a client calls. Every route but /healthz
// needs the node token as a bearer token.
const (
	RouteHealth         = "GET /healthz"
	RouteProvision      = "POST /v1/provision"
	RouteSessionAction  = "POST /v1/sessions/{id}" // {id} is "<session id>:<action>"
	RouteDeleteSnapshot = "DELETE /v1/snapshots/{id}"
	RouteAgent          = "/v1/sessions/{id}/agent/"

	PathHealth    = "/healthz"
	PathProvision = "/v1/provision"
)

// The actions of RouteSessionAction.
const (
	ActionPause    = "pause"    // no body; 204
	ActionResume   = "resume"   // no body; 204
	ActionTouch    = "touch"    // no body; 204, also for a session the node does not hold
	ActionRetime   = "retime"   // RetimeRequest; 204
	ActionStop     = "stop"     // StopRequest; 204, or 200 SnapshotResult with save_as
	ActionSnapshot = "snapshot" // SnapshotRequest; 200 SnapshotResult
)

// SessionActionPath is the path of an action on a session.
func SessionActionPath(sessionID, action string) string {
	return "/v1/sessions/" + sessionID + ":" + action
}

// SnapshotPath is the path that deletes a snapshot's files.
func SnapshotPath(snapshotID string) string { return "/v1/snapshots/" + snapshotID }

// AgentBase is the base path of the proxy to a session's agent: the agent's own paths follow
// it (AgentBase(id)+"/v1/exec").
func AgentBase(sessionID string) string { return "/v1/sessions/" + sessionID + "/agent" }

// The kinds of calls to a guest's agent, as the node's metrics count them
// (wb_node_agent_requests_total's kind).
const (
	AgentKindExec  = "exec"
	AgentKindPTY   = "pty"
	AgentKindFiles = "files"
	AgentKindOther = "other"
)

// agentKindKey carries the kind of the calls a caller means to make of an agent's client.
type agentKindKey struct{}

// WithAgentKind marks ctx, given to a node's Local.Agent, with the kind of the calls its
// caller means to make of the client (AgentKindFiles, AgentKindPTY): a refusal before any
// call (no guest, a guest not running) is counted under it, as the node's API counts the
// call it refuses.
func WithAgentKind(ctx context.Context, kind string) context.Context {
	return context.WithValue(ctx, agentKindKey{}, kind)
}

// AgentKindOf is ctx's kind (WithAgentKind), AgentKindOther without one.
func AgentKindOf(ctx context.Context) string {
	if k, ok := ctx.Value(agentKindKey{}).(string); ok && k != "" {
		return k
	}
	return AgentKindOther
}

// Health answers GET /healthz.
type Health struct {
	Status string `json:"status"` // "ok"
}

// ProvisionRequest is the body of POST /v1/provision: the placed session, as the store holds
// it. The node starts its guest in the background and reports the outcome through Redis.
type ProvisionRequest = session.Session

// ProvisionAccepted answers it, with 202.
type ProvisionAccepted struct {
	SessionID string `json:"session_id"`
}

// RetimeRequest is the body of :retime: the session's timers after a PATCH. The node checks
// them against the session's tier and enforces them from then on.
type RetimeRequest struct {
	IdleTimeoutS int `json:"idle_timeout_s"`
	MaxLifetimeS int `json:"max_lifetime_s"`
}

// StopRequest is the body of :stop: the control plane moved the session to stopping for
// Reason; the node tears the guest down and ends the session. With SaveAs, a snapshot id, the
// node first saves the guest, memory and all, as that snapshot where its back end can (a
// desktop's sleep), and answers a SnapshotResult (Memory false: nothing saved).
type StopRequest struct {
	ProjectID string         `json:"project_id"`
	Reason    session.Reason `json:"state_reason,omitempty"`
	Rule      string         `json:"rule,omitempty"` // the policy rule that stopped it, if any
	SaveAs    string         `json:"save_as,omitempty"`
}

// SnapshotRequest is the body of :snapshot.
type SnapshotRequest struct {
	SnapshotID    string `json:"snapshot_id"`
	IncludeMemory bool   `json:"include_memory"`
}

// SnapshotResult answers it: whether memory was included, the snapshot's size, and the root
// disk image a memory snapshot's guest ran on where only a node with that image can restore
// its memory (hypervisor.SnapshotInfo.RootImage; absent from an earlier node, and ignored by
// an earlier gateway).
type SnapshotResult struct {
	Memory    bool   `json:"memory"`
	SizeBytes int64  `json:"size_bytes"`
	RootImage string `json:"root_image,omitempty"`
}

// Error codes. Where the public API has the same meaning, the code is the API's.
const (
	CodeInvalidRequest   = "invalid_request"   // 400: a body or id the node cannot use
	CodeUnauthenticated  = "unauthenticated"   // 401: a bad or missing node token
	CodePolicyViolation  = "policy_violation"  // 403: the runtime policy killed the session for a command
	CodePolicyError      = "policy_error"      // 403: the runtime policy could not decide; the command is refused
	CodeForbidden        = "forbidden"         // 403: the caller's certificate is of a role that does not call this route (an Envoy's, outside the edge's data path)
	CodeNotFound         = "not_found"         // 404: the node holds no guest for the session
	CodeNoRoute          = "no_route"          // 404: no such route or action
	CodeInvalidState     = "invalid_state"     // 409: the guest's state here does not allow it; the message names the state
	CodeInternal         = "internal"          // 500: the node failed (the runtime, its disk, Redis)
	CodeAgentUnreachable = "agent_unreachable" // 502: the guest's agent did not answer the proxy
	CodeGuestError       = "guest_error"       // 502: the guest's agent answered what the node does not pass on as its own (a line shaped as the node's record, a 403)
	CodeUnavailable      = "unavailable"       // 503: the node is shutting down and starts nothing new
	CodeHTTPError        = "http_error"        // an answer that carried no error body (a proxy in between)
)

// Error is the node's error answer: the HTTP status, a code above and a message. On the
// wire it is ErrorBody.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"` // the field at fault (400), or the policy rule (403)
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("node answered %d %s", e.Status, e.Code)
	if e.Param != "" {
		msg += " (" + e.Param + ")"
	}
	return msg + ": " + e.Message
}

// ErrorBody is the body of every error answer of the node, the same shape as the agent's and
// the public API's.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// ParseError reads an error answer of the node: its ErrorBody with status, or, when the body
// is not one, an Error with CodeHTTPError carrying the status line and the start of the body.
func ParseError(status int, body []byte) *Error {
	var eb ErrorBody
	if err := json.Unmarshal(body, &eb); err == nil && eb.Error != nil && eb.Error.Code != "" {
		eb.Error.Status = status
		return eb.Error
	}
	const maxShown = 512
	shown := strings.TrimSpace(string(body))
	if len(shown) > maxShown {
		shown = shown[:maxShown] + "…"
	}
	return &Error{Status: status, Code: CodeHTTPError, Message: strings.TrimSpace(fmt.Sprintf("%d %s %s", status, http.StatusText(status), shown))}
}
