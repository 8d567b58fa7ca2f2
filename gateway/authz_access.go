package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"wb/internal/edgeauth"
	"wb/session"
	"wb/store"
)

// The data path (exec, PTY, files) has two doors that must answer alike: ext_authz, which
// lets Envoy send the request straight to the session's node (authz.go), and the gateway's
// own handlers, which `wb serve` uses without Envoy. Both authenticate with dataCaller and
// judge the session's state with errNeedsRunning; this file holds what they share.

// Grant lifetimes of the shared contract: an edge grant only has to outlive Envoy's hop to
// the node; a connect token lives as long as a caller may reasonably hold a session object.
const (
	EdgeGrantTTL    = 60 * time.Second
	ConnectTokenTTL = 15 * time.Minute
)

// connectTokenParam is the query parameter of a connect URL that carries its token.
const connectTokenParam = "token"

// edgeAccess is the Server's state for the data path: the grant signers, keyed by the secret
// the gateways and nodes share in Redis (read once, on first use), and the session lookups of
// ext_authz. Its zero value is ready.
type edgeAccess struct {
	signers  atomic.Pointer[edgeSigners]
	signerMu sync.Mutex // one reader of the secret at a time
	lookups  sessionLookups
	watch    sync.Once
}

type edgeSigners struct{ edge, connect *edgeauth.Signer }

// signers answers the edge and connect signers, reading the shared secret on first use.
func (s *Server) signers(ctx context.Context) (*edgeSigners, error) {
	if sg := s.access.signers.Load(); sg != nil {
		return sg, nil
	}
	s.access.signerMu.Lock()
	defer s.access.signerMu.Unlock()
	if sg := s.access.signers.Load(); sg != nil {
		return sg, nil
	}
	secret, err := s.Store.EdgeSecret(ctx)
	if err != nil {
		return nil, err
	}
	edge, err := edgeauth.NewSigner(secret, edgeauth.PurposeEdge)
	if err != nil {
		return nil, err
	}
	connect, err := edgeauth.NewSigner(secret, edgeauth.PurposeConnect)
	if err != nil {
		return nil, err
	}
	sg := &edgeSigners{edge: edge, connect: connect}
	s.access.signers.Store(sg)
	return sg, nil
}

// dataOp is what a data-path request does to its session.
type dataOp int

const (
	opExec dataOp = iota + 1
	opPTY
	opFiles
)

// dataRoute is a request on the data path: the session it names and what it does.
type dataRoute struct {
	sessionID string
	op        dataOp
}

// maxSessionIDLen bounds the id taken from a path: longer ones name no session.
const maxSessionIDLen = 128

// parseDataRoute recognises the data-path routes of the shared contract in a method and a
// request target (path and query, as Envoy sends it): POST /v1/sessions/{id}/exec,
// GET /v1/sessions/{id}/pty and GET|PUT|DELETE /v1/sessions/{id}/files. Anything else is not
// the data path.
func parseDataRoute(method, target string) (dataRoute, bool) {
	path, _, _ := strings.Cut(target, "?")
	rest, ok := strings.CutPrefix(path, "/v1/sessions/")
	if !ok {
		return dataRoute{}, false
	}
	id, action, ok := strings.Cut(rest, "/")
	if !ok || id == "" || len(id) > maxSessionIDLen || strings.Contains(action, "/") {
		return dataRoute{}, false
	}
	switch {
	case action == "exec" && method == http.MethodPost:
		return dataRoute{id, opExec}, true
	case action == "pty" && method == http.MethodGet:
		return dataRoute{id, opPTY}, true
	case action == "files" && (method == http.MethodGet || method == http.MethodPut || method == http.MethodDelete):
		return dataRoute{id, opFiles}, true
	}
	return dataRoute{}, false
}

// errNeedsRunning is the 409 of a data-path request to a session that is not running, as the
// gateway's handlers and ext_authz both answer it.
func errNeedsRunning(op dataOp, st session.State) *apiError {
	if op == opExec {
		return errState("session is %s; exec needs a running session", st)
	}
	return errState("session is %s; files and PTY need a running session", st)
}

// dataCaller is who sent a data-path request: a project by its API key, or the holder of a
// connect token for the session the request names (then only project.ID is set).
type dataCaller struct {
	project store.Project
	byToken bool
}

// identify authenticates a data-path request for session sessionID: the API key in
// authorization ("Bearer <key>", the gateway's auth cache in front of Redis) when there is
// one, else the connect token, which must name that session.
func (s *Server) identify(ctx context.Context, authorization, token, sessionID string) (dataCaller, error) {
	if key, ok := strings.CutPrefix(authorization, "Bearer "); ok && key != "" {
		p, err := s.authenticate(ctx, key)
		if errors.Is(err, store.ErrBadKey) || errors.Is(err, store.ErrNotFound) {
			return dataCaller{}, errUnauthenticated("unknown API key", "")
		}
		return dataCaller{project: p}, err
	}
	if token == "" {
		return dataCaller{}, errUnauthenticated("send Authorization: Bearer <api key>, or use the session's connect URL (its token query parameter)", "")
	}
	sg, err := s.signers(ctx)
	if err != nil {
		return dataCaller{}, err
	}
	g, err := sg.connect.Verify(token, s.Now())
	if err != nil {
		why := strings.TrimPrefix(err.Error(), edgeauth.ErrInvalid.Error()+": ")
		if strings.HasPrefix(why, "expired") {
			why = "the connect token " + why
		} else {
			why = "the connect token is not valid (" + why + ")"
		}
		return dataCaller{}, errUnauthenticated(why+"; take a fresh connect URL from GET /v1/sessions/"+sessionID, connectTokenParam)
	}
	if g.SessionID != sessionID {
		return dataCaller{}, errUnauthenticated("the connect token is for another session; use the connect URL of session "+sessionID, connectTokenParam)
	}
	return dataCaller{project: store.Project{ID: g.ProjectID}, byToken: true}, nil
}

func errUnauthenticated(msg, param string) *apiError {
	return &apiError{Status: 401, Type: "unauthenticated", Code: "unauthenticated", Message: msg, Param: param}
}

// connectTokenKey marks a request's context as authenticated by a connect token.
type connectTokenKey struct{}

// dataPath authenticates a data-path handler's request as identify does. A request that came
// with a connect token reaches h with its project read in full and as byConnectToken makes it.
func (s *Server) dataPath(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		q := r.URL.Query()
		c, err := s.identify(ctx, r.Header.Get("Authorization"), q.Get(connectTokenParam), r.PathValue("id"))
		if err == nil && c.byToken {
			c.project, err = s.Store.GetProject(ctx, c.project.ID)
			if errors.Is(err, store.ErrNotFound) {
				err = errUnauthenticated("the connect token's project no longer exists", connectTokenParam)
			}
			r = byConnectToken(r)
		}
		if err == nil {
			err = h(w, r, c.project)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

// byConnectToken answers r as the handlers see a request that came with a connect token:
// without the token in its URL (handlers, logs and Idempotency-Key fingerprints never see it,
// so a retry through a fresher connect URL is the same request) and marked as such in its
// context (ptyAcceptOptions). The gateway's handlers and the node's data path both use it.
func byConnectToken(r *http.Request) *http.Request {
	q := r.URL.Query()
	q.Del(connectTokenParam)
	u := *r.URL
	u.RawQuery = q.Encode()
	r = r.WithContext(context.WithValue(r.Context(), connectTokenKey{}, true))
	r.URL, r.RequestURI = &u, u.RequestURI()
	return r
}

// ptyAcceptOptions lets a browser page of any origin open a PTY with a connect token: the
// token is a bearer credential in the URL, never an ambient one like a cookie, so the origin
// check that guards against cross-site use of ambient credentials protects nothing here.
// Without a token the default (same-origin) check stays.
func ptyAcceptOptions(r *http.Request) *websocket.AcceptOptions {
	if byToken, _ := r.Context().Value(connectTokenKey{}).(bool); byToken {
		return &websocket.AcceptOptions{OriginPatterns: []string{"*"}}
	}
	return nil
}

// withConnectToken answers a copy of sess whose connect URLs carry a fresh connect token
// (ConnectTokenTTL) for it. The store keeps the URLs without one.
func (s *Server) withConnectToken(ctx context.Context, sess *session.Session) (*session.Session, error) {
	sg, err := s.signers(ctx)
	if err != nil {
		return nil, err
	}
	tok := url.QueryEscape(sg.connect.Sign(edgeauth.Grant{SessionID: sess.ID, ProjectID: sess.ProjectID,
		Expires: s.Now().Add(ConnectTokenTTL).Unix()}))
	out := *sess
	out.Connect.ExecURL = addQuery(sess.Connect.ExecURL, connectTokenParam+"="+tok)
	out.Connect.PTYURL = addQuery(sess.Connect.PTYURL, connectTokenParam+"="+tok)
	return &out, nil
}

func addQuery(u, kv string) string {
	if u == "" {
		return ""
	}
	if strings.Contains(u, "?") {
		return u + "&" + kv
	}
	return u + "?" + kv
}

// writeSession answers a session with fresh connect tokens.
func (s *Server) writeSession(ctx context.Context, w http.ResponseWriter, status int, sess *session.Session) error {
	out, err := s.withConnectToken(ctx, sess)
	if err != nil {
		return err
	}
	// writeJSON's bytes, without json.Marshal's walk of the struct (Session.AppendJSON).
	b := append(out.AppendJSON(make([]byte, 0, 1536)), '\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return nil
}
