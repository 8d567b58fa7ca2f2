package node

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"path/filepath"
	"strings"
	"time"

	"wb/agent"
	"wb/session"
)

// Handler serves the node's API to the control plane: provisioning and the guest controls,
// and /v1/sessions/{id}/agent/…, a reverse proxy to the session's agent (exec, files, PTY over
// WebSocket) that counts every call as activity. Every request carries token as a bearer token.
func (n *Node) Handler(token string) http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, map[string]string{"status": "ok"}) })
	m.HandleFunc("POST /v1/provision", n.apiProvision)
	m.HandleFunc("POST /v1/sessions/{id}", n.apiAction)
	m.HandleFunc("DELETE /v1/snapshots/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := n.DeleteSnapshot(r.PathValue("id")); err != nil {
			apiErr(w, 500, err)
			return
		}
		w.WriteHeader(204)
	})
	m.HandleFunc("/v1/sessions/{id}/agent/", n.apiAgent)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if r.URL.Path != "/healthz" && subtle.ConstantTimeCompare([]byte(key), []byte(token)) != 1 {
			apiErr(w, 401, errors.New("node: bad or missing token"))
			return
		}
		m.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiErr(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]map[string]string{"error": {"message": err.Error()}})
}

func decodeSession(r *http.Request) (*session.Session, error) {
	var s session.Session
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

// apiProvision starts a guest in the background: the node reports the outcome through Redis.
func (n *Node) apiProvision(w http.ResponseWriter, r *http.Request) {
	s, err := decodeSession(r)
	if err != nil {
		apiErr(w, 400, err)
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		_ = n.Provision(n.ctx, n.Info, s)
	}()
	writeJSON(w, 202, map[string]string{"session_id": s.ID})
}

// SnapshotRequest is the body of POST /v1/sessions/{id}:snapshot.
type SnapshotRequest struct {
	SnapshotID    string `json:"snapshot_id"`
	IncludeMemory bool   `json:"include_memory"`
}

// SnapshotResult answers it.
type SnapshotResult struct {
	Memory    bool  `json:"memory"`
	SizeBytes int64 `json:"size_bytes"`
}

func (n *Node) apiAction(w http.ResponseWriter, r *http.Request) {
	id, action, _ := strings.Cut(r.PathValue("id"), ":")
	ref := &session.Session{ID: id}
	ctx := r.Context()
	var err error
	switch action {
	case "pause":
		err = n.Pause(ctx, ref)
	case "resume":
		err = n.Resume(ctx, ref)
	case "touch":
		n.Touch(ref)
	case "stop", "retime":
		var s *session.Session
		if s, err = decodeSession(r); err == nil {
			s.ID = id
			if action == "stop" {
				err = n.Stop(ctx, s)
			} else {
				n.Retime(ctx, s)
			}
		}
	case "snapshot":
		var req SnapshotRequest
		if err = json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
			apiErr(w, 400, err)
			return
		}
		if !validName(req.SnapshotID) {
			apiErr(w, 400, errors.New("node: bad snapshot id"))
			return
		}
		mem, size, err := n.Snapshot(ctx, ref, req.SnapshotID, req.IncludeMemory)
		if err != nil {
			apiErr(w, 409, err)
			return
		}
		writeJSON(w, 200, SnapshotResult{Memory: mem, SizeBytes: size})
		return
	default:
		apiErr(w, 404, errors.New("node: unknown action "+action))
		return
	}
	if err != nil {
		apiErr(w, 409, err)
		return
	}
	w.WriteHeader(204)
}

// apiAgent proxies to the session's agent while it runs.
func (n *Node) apiAgent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	l, err := n.running(&session.Session{ID: id})
	if err != nil {
		apiErr(w, 409, err)
		return
	}
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/agent/v1/exec") {
		// The runtime decision point sees every command before the guest runs it.
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err != nil {
			apiErr(w, 400, err)
			return
		}
		var req struct {
			Argv []string `json:"argv"`
		}
		_ = json.Unmarshal(body, &req)
		l.mu.Lock()
		err = n.checkExec(r.Context(), l, req.Argv)
		l.mu.Unlock()
		if err != nil {
			writeRuntimeRefusal(w, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/agent/v1/pty") {
		// A PTY's command is an exec like any other.
		l.mu.Lock()
		err := n.checkPTY(r.Context(), l, r.URL.Query().Get("command"))
		l.mu.Unlock()
		if err != nil {
			writeRuntimeRefusal(w, err)
			return
		}
	}
	l.mu.Lock()
	proxy := l.proxy
	if proxy == nil {
		sock := filepath.Join(n.guestDir(l.g.GuestID), "agent", "agent.sock")
		proxy = agentProxy(sock)
		l.proxy = proxy
	}
	l.mu.Unlock()
	r.Header.Del("Authorization")
	// The agent answers an exec while its request may still be arriving; without full duplex
	// the server would close the request body once the answer starts, and the proxy would cut
	// the agent's connection mid-answer.
	_ = http.NewResponseController(w).EnableFullDuplex()
	proxy.ServeHTTP(w, r)
}

// writeRuntimeRefusal answers a command the runtime decision point did not allow: 403
// policy_violation when a policy killed the session, 403 policy_error when the session's
// policy could not decide (the command fails closed).
func writeRuntimeRefusal(w http.ResponseWriter, err error) {
	var ke *KilledError
	if errors.As(err, &ke) {
		writeJSON(w, 403, map[string]map[string]string{"error": {"code": "policy_violation", "message": ke.Error(), "param": ke.Rule}})
		return
	}
	writeJSON(w, 403, map[string]map[string]string{"error": {"code": "policy_error", "message": err.Error()}})
}

// agentProxy forwards /v1/sessions/{id}/agent/<rest> to /<rest> on the agent's socket, streaming
// (exec output is flushed as it comes) and upgrading to WebSocket for the PTY.
func agentProxy(sock string) *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return agent.DialSocket(ctx, sock)
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	return &httputil.ReverseProxy{
		Transport:     tr,
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "agent"
			if _, rest, ok := strings.Cut(pr.In.URL.Path, "/agent/"); ok {
				pr.Out.URL.Path = "/" + rest
			}
			pr.Out.URL.RawPath = ""
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			apiErr(w, 502, err)
		},
	}
}

func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
