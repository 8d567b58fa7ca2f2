package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"wb/internal/edgeauth"
	"wb/internal/stallwrite"
	"wb/session"
	"wb/store"
)

// DataPathConfig wires a DataPath.
type DataPathConfig struct {
	Store *store.Store
	// Guests are the guests of the node that serves the data path, reached in process.
	Guests Guests
	// NodeID is the serving node's id, as registered: a grant must name it.
	NodeID string
	// Fallback serves every request that is not exec, PTY or files (the node's own API);
	// nil answers 404.
	Fallback http.Handler
	Logger   *slog.Logger
	Now      func() time.Time
	// MaxOutputBytes, MaxReplayBytes, MaxConcurrentExecs, MaxConcurrentFileCalls and
	// MaxConcurrentPTYs as in Config (0: the same defaults).
	MaxOutputBytes         int
	MaxReplayBytes         int
	MaxConcurrentExecs     int
	MaxConcurrentFileCalls int
	MaxConcurrentPTYs      int
	// WriteStall as in Config (0: DefaultWriteStall).
	WriteStall time.Duration
	// Registry, when set, gets the data path's request metrics (wb_http_requests_total and
	// wb_http_request_duration_seconds, by route, method and status): the serving node's,
	// which has the process's collectors already. Nil keeps them unexposed.
	Registry prometheus.Registerer
}

// DataPath serves the routes the edge sends straight to a session's node: exec, PTY and
// files, with the API's own handlers, so that bodies, statuses, errors, output caps and
// activity are the gateway's to the byte. Instead of an API key, a request carries the grant
// that ext_authz signed (edgeauth.HeaderEdgeAuth, purpose edgeauth.PurposeEdge) for the
// session in its path and for this node; the grant's project scopes the session lookup.
type DataPath struct {
	s        *Server
	nodeID   string
	fallback http.Handler

	mu     sync.Mutex
	grants *edgeauth.Signer // keyed by secret, Store.EdgeSecret, read on first use
	secret []byte
	readAt time.Time // when the secret was last read
	// recheck is how often a grant that does not verify may make the node read the secret
	// again: a Redis that lost its data makes a new secret, which the gateways then sign with.
	recheck time.Duration
}

// NewDataPath returns a DataPath. Call Close to end its PTY sessions.
func NewDataPath(cfg DataPathConfig) (*DataPath, error) {
	if cfg.Store == nil || cfg.Guests == nil || cfg.NodeID == "" {
		return nil, errors.New("gateway: the data path needs Store, Guests and NodeID")
	}
	metrics := NewMetrics(nil)
	if cfg.Registry != nil {
		for _, c := range []prometheus.Collector{metrics.requests, metrics.latency} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("gateway: the data path's metrics: %w", err)
			}
		}
	}
	c := Config{Store: cfg.Store, Guests: cfg.Guests, Logger: cfg.Logger, Now: cfg.Now, Metrics: metrics,
		MaxOutputBytes: cfg.MaxOutputBytes, MaxReplayBytes: cfg.MaxReplayBytes, MaxConcurrentExecs: cfg.MaxConcurrentExecs,
		MaxConcurrentFileCalls: cfg.MaxConcurrentFileCalls, MaxConcurrentPTYs: cfg.MaxConcurrentPTYs, WriteStall: cfg.WriteStall}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxOutputBytes <= 0 {
		c.MaxOutputBytes = session.DefaultMaxOutputBytes
	}
	if c.MaxReplayBytes <= 0 {
		c.MaxReplayBytes = 2*c.MaxOutputBytes + 1<<20
	}
	if c.MaxConcurrentExecs <= 0 {
		c.MaxConcurrentExecs = DefaultMaxConcurrentExecs
	}
	if c.WriteStall <= 0 {
		c.WriteStall = DefaultWriteStall
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Config: c, log: c.Logger, ctx: ctx, cancel: cancel,
		execs: newProjectSlots("exec", "too_many_execs"), asyncRuns: newProjectSlots("async run", "too_many_runs"),
		fileCalls: newFileCallSlots(), ptys: newPTYSlots()}
	d := &DataPath{s: s, nodeID: cfg.NodeID, fallback: cfg.Fallback, recheck: 10 * time.Second}
	m := http.NewServeMux()
	s.dataRoutes(func(pattern string, h handler) { m.Handle(pattern, d.granted(h)) })
	s.mux = m
	return d, nil
}

// Handler serves the data path, and Fallback for every other route (outside the data
// path's instrumentation: the node's API keeps its own errors and WebSocket proxy as is).
// net/http's last writes of each answer, the node API's too, are bounded by WriteStall.
func (d *DataPath) Handler() http.Handler {
	data := d.s.Metrics.instrument(d.s.mux)
	return stallwrite.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := d.s.mux.Handler(r); pattern != "" {
			data.ServeHTTP(w, r)
			return
		}
		if d.fallback != nil {
			d.fallback.ServeHTTP(w, r)
			return
		}
		d.s.writeError(w, r, &apiError{Status: 404, Type: "not_found", Code: "no_route", Message: "no route " + r.Method + " " + r.URL.Path})
	}), d.s.WriteStall)
}

// Close ends the PTY sessions in progress.
func (d *DataPath) Close() { d.s.Close() }

// granted checks the request's edge grant and calls h with the grant's project; a request
// the edge let through by its connect token reaches h as through the gateway's handlers.
func (d *DataPath) granted(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g, err := d.authorize(r)
		if err == nil {
			if g.ByToken {
				r = byConnectToken(r)
			}
			err = h(w, r, store.Project{ID: g.ProjectID})
		}
		if err != nil {
			d.s.writeError(w, r, err)
		}
	})
}

// authorize answers the request's grant when the grant is valid now, names the session in
// the path, and names this node. Nothing else is trusted from the grant than its project and
// ByToken: the handler then loads the session and checks its state as the API does.
func (d *DataPath) authorize(r *http.Request) (edgeauth.Grant, error) {
	values := r.Header.Values(edgeauth.HeaderEdgeAuth)
	if len(values) == 0 || values[0] == "" {
		return edgeauth.Grant{}, errEdgeAuth("this node serves exec, PTY and files only to requests the edge authorized, with the " +
			edgeauth.HeaderEdgeAuth + " header; call through the edge or the API")
	}
	if len(values) > 1 {
		return edgeauth.Grant{}, errEdgeAuth("send one " + edgeauth.HeaderEdgeAuth + " header, not several")
	}
	signer, err := d.signer(r.Context(), false)
	if err != nil {
		return edgeauth.Grant{}, err
	}
	g, err := signer.Verify(values[0], d.s.Now())
	if err != nil {
		if fresh, ferr := d.signer(r.Context(), true); ferr == nil && fresh != signer {
			g, err = fresh.Verify(values[0], d.s.Now())
		}
	}
	if err != nil {
		return edgeauth.Grant{}, errEdgeAuth(edgeauth.HeaderEdgeAuth + ": " + err.Error() + "; ask the edge again")
	}
	if id := r.PathValue("id"); g.SessionID != id {
		return edgeauth.Grant{}, errEdgeDenied("the edge grant is for session %q, not %q", g.SessionID, id)
	}
	if g.NodeID != d.nodeID {
		return edgeauth.Grant{}, errEdgeDenied("the edge grant is for node %q, not this node (%q)", g.NodeID, d.nodeID)
	}
	return g, nil
}

// signer answers the verifier of edge grants. It reads the shared secret on first use, so
// that a node whose Redis is away at start still starts (its data path answers 503 until
// Redis does), and again on recheck (a grant that did not verify) at most once every
// d.recheck. Redis is read outside the lock: a slow Redis never holds up valid grants.
func (d *DataPath) signer(ctx context.Context, recheck bool) (*edgeauth.Signer, error) {
	d.mu.Lock()
	cur := d.grants
	fresh := cur != nil && (!recheck || time.Since(d.readAt) < d.recheck)
	if cur != nil && !fresh {
		d.readAt = time.Now() // one recheck per period, however many bad grants arrive
	}
	d.mu.Unlock()
	if fresh {
		return cur, nil
	}
	secret, err := d.s.Store.EdgeSecret(ctx)
	var signer *edgeauth.Signer
	if err == nil {
		signer, err = edgeauth.NewSigner(secret, edgeauth.PurposeEdge)
	}
	if err != nil {
		d.s.log.WarnContext(ctx, "edge data path: cannot read the grants' key", "err", err)
		if cur != nil {
			return cur, nil
		}
		return nil, &apiError{Status: 503, Type: "api_error", Code: "edge_unavailable", Message: "the node cannot read the edge's key from Redis yet; retry", RetryAfter: time.Second}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.grants == nil || !bytes.Equal(secret, d.secret) {
		d.grants, d.secret, d.readAt = signer, secret, time.Now()
	}
	return d.grants, nil
}

func errEdgeAuth(msg string) *apiError {
	return &apiError{Status: 401, Type: "unauthenticated", Code: "unauthenticated", Param: edgeauth.HeaderEdgeAuth, Message: msg}
}

// errEdgeDenied is a valid grant for another request. Still a 401, not a 403: the grant is the
// request's only credential, and for this request it is none (and 401 is what the API
// documents for a credential that does not open a session).
func errEdgeDenied(format string, args ...any) *apiError {
	return errEdgeAuth(fmt.Sprintf(format, args...) + "; ask the edge again")
}
