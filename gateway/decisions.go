package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"wb/decide"
	"wb/plugins"
	"wb/policies"
	"wb/session"
	"wb/store"
)

// Chain is the admission decision point as the gateway asks it: package decide composes the
// platform's and the project's Rego policies and the project's Wasm plugins; Chain only turns
// a patch that may not be applied into the API's 403 naming the field.
type Chain struct {
	Policies *policies.Engine // nil: none
	Plugins  *plugins.Host    // nil: none
	Now      func() time.Time
}

// Admit runs the chain.
func (c Chain) Admit(ctx context.Context, in session.AdmissionInput) (session.Decision, error) {
	d := decide.Decider{Now: c.Now}
	if c.Policies != nil { // a nil *Engine in the interface would not be nil
		d.Policies = c.Policies
	}
	if c.Plugins != nil {
		d.Plugins = c.Plugins
	}
	out, err := d.Admit(ctx, in)
	var pe *decide.PatchError
	if errors.As(err, &pe) {
		return session.Decision{}, &apiError{Status: 403, Type: "denied", Code: "denied", Param: pe.Field, Message: pe.Reason}
	}
	return out, err
}

// applyAdmissionPatch applies the chain's patch to req and validates the result again in full,
// references included. Anything wrong is the decider's doing, so it is a deny (403) naming the
// field and the decider, never a request the caller did not send.
func (s *Server) applyAdmissionPatch(ctx context.Context, p store.Project, req session.CreateRequest, d session.Decision) (session.CreateRequest, error) {
	decider := d.Decider
	if decider == "" {
		decider = "an admission decider"
	}
	deny := func(param, format string, args ...any) error {
		return &apiError{Status: 403, Type: "denied", Code: "denied", Param: param, Message: fmt.Sprintf(format, args...)}
	}
	if pe := decide.CheckPatch(decider, d.Patch); pe != nil {
		return req, deny(pe.Field, "%s", pe.Reason)
	}
	patched, err := plugins.ApplyPatch(req, d)
	if err != nil {
		return req, deny("", "%s: the patch does not fit the request: %v", decider, err)
	}
	if _, err := patched.Validate(s.Tiers); err != nil {
		var fe *session.FieldError
		if errors.As(err, &fe) {
			return req, deny(fe.Field, "%s: the patched request is invalid: %v", decider, fe)
		}
		return req, err
	}
	if err := s.validateRefs(ctx, p, &patched); err != nil {
		if ae := toAPIError(err); ae.Status == 400 {
			return req, deny(ae.Param, "%s: the patched request is invalid: %s", decider, ae.Message)
		}
		return req, err
	}
	return patched, nil
}

// policyError maps the policies package's errors to API errors.
func policyError(err error) error {
	var ce *policies.CompileError
	switch {
	case errors.As(err, &ce):
		msg := ce.Error()
		param := "body"
		if len(ce.Errors) > 0 {
			param = fmt.Sprintf("body:%d:%d", ce.Errors[0].Row, ce.Errors[0].Col)
		}
		return &apiError{Status: 400, Type: "invalid_request", Code: "policy_compile_error", Param: param, Message: msg}
	case errors.Is(err, policies.ErrNotFound):
		return &apiError{Status: 404, Type: "not_found", Code: "not_found", Message: "no such policy in this project"}
	case errors.Is(err, policies.ErrInvalid):
		msg := strings.TrimPrefix(err.Error(), "policies: ")
		param := ""
		if strings.Contains(msg, "policy name") {
			param = "name"
		}
		return errInvalid(param, "%s", msg)
	}
	return err
}

func pluginError(err error) error {
	var ve *plugins.ValidationError
	switch {
	case errors.As(err, &ve):
		return &apiError{Status: 400, Type: "invalid_request", Code: "invalid_plugin", Param: "body", Message: ve.Error()}
	case errors.Is(err, plugins.ErrNotFound):
		return &apiError{Status: 404, Type: "not_found", Code: "not_found", Message: "no such plugin in this project"}
	}
	return err
}

// MaxPolicyBytes and MaxPluginBytes bound the uploads.
const (
	MaxPolicyBytes = 256 << 10
	MaxPluginBytes = 10 << 20
)

func readRaw(r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, errInvalid("body", "could not read the body: %v", err)
	}
	if int64(len(b)) > limit {
		return nil, &apiError{Status: 413, Type: "invalid_request", Code: "too_large", Message: fmt.Sprintf("the body is over %d bytes", limit)}
	}
	if len(b) == 0 {
		return nil, errInvalid("body", "the body is empty")
	}
	return b, nil
}

// putPolicy: PUT /v1/policies/{name}?mode=enforce|warn|dryrun with the Rego as the body.
func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.Policies == nil {
		return &apiError{Status: 503, Type: "api_error", Code: "no_policies", Message: "policies are not enabled here"}
	}
	mode := policies.Mode(r.URL.Query().Get("mode"))
	if mode == "" {
		mode = policies.ModeEnforce
	}
	if !mode.Valid() {
		return errInvalid("mode", "must be enforce, warn or dryrun, got %q", mode)
	}
	src, err := readRaw(r, MaxPolicyBytes)
	if err != nil {
		return err
	}
	v, err := s.Policies.Put(r.Context(), p.ID, r.PathValue("name"), string(src), mode)
	if err != nil {
		return policyError(err)
	}
	writeJSON(w, 201, policyObject(v))
	return nil
}

func (s *Server) listPolicies(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.Policies == nil {
		writeJSON(w, 200, session.NewList[Policy](nil, ""))
		return nil
	}
	vs, err := s.Policies.Policies(r.Context(), p.ID)
	if err != nil {
		return policyError(err)
	}
	out := []Policy{}
	for _, v := range vs {
		out = append(out, policyObject(v))
	}
	writeJSON(w, 200, session.NewList(out, ""))
	return nil
}

// getPolicy: GET /v1/policies/{name} lists its versions, newest first.
func (s *Server) getPolicy(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.Policies == nil {
		return policyError(policies.ErrNotFound)
	}
	vs, err := s.Policies.Versions(r.Context(), p.ID, r.PathValue("name"))
	if err != nil {
		return policyError(err)
	}
	if len(vs) == 0 {
		return policyError(policies.ErrNotFound)
	}
	out := []Policy{}
	for i := len(vs) - 1; i >= 0; i-- {
		out = append(out, policyObject(vs[i]))
	}
	writeJSON(w, 200, session.NewList(out, ""))
	return nil
}

// deletePolicy: DELETE /v1/policies/{name} deletes every version, unless a live session pins
// one (409 naming them).
func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.Policies == nil {
		return policyError(policies.ErrNotFound)
	}
	name := r.PathValue("name")
	n, err := s.Policies.Delete(r.Context(), p.ID, name)
	if err != nil {
		return policyError(err)
	}
	writeJSON(w, 200, PolicyDeleted{Object: "policy", Name: name, Deleted: true, Versions: n})
	return nil
}

// putPlugin: PUT /v1/plugins/{name}?points=admission,runtime&order=N&fail_open=true, body wasm.
func (s *Server) putPlugin(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.Plugins == nil {
		return &apiError{Status: 503, Type: "api_error", Code: "no_plugins", Message: "plugins are not enabled here"}
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && ct != "application/wasm" && ct != "application/octet-stream" {
		return &apiError{Status: 415, Type: "invalid_request", Code: "unsupported_media_type", Message: fmt.Sprintf("Content-Type must be application/wasm, got %q", ct)}
	}
	q := r.URL.Query()
	points := []string{session.PointAdmission}
	if v := q.Get("points"); v != "" {
		points = strings.Split(v, ",")
	}
	order := 0
	if v := q.Get("order"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1000 {
			return errInvalid("order", "must be an integer 0–1000, got %q", v)
		}
		order = n
	}
	failOpen := false
	switch v := q.Get("fail_open"); v {
	case "", "false":
	case "true":
		failOpen = true
	default:
		return errInvalid("fail_open", "must be true or false, got %q", v)
	}
	wasm, err := readRaw(r, MaxPluginBytes)
	if err != nil {
		return err
	}
	pl, err := s.Plugins.Put(r.Context(), p.ID, r.PathValue("name"), wasm, points, order, failOpen)
	if err != nil {
		return pluginError(err)
	}
	writeJSON(w, 201, pluginObject(pl))
	return nil
}

func (s *Server) listPlugins(w http.ResponseWriter, r *http.Request, p store.Project) error {
	out := []Plugin{}
	if s.Plugins != nil {
		pls, err := s.Plugins.List(r.Context(), p.ID)
		if err != nil {
			return pluginError(err)
		}
		for _, pl := range pls {
			out = append(out, pluginObject(pl))
		}
	}
	writeJSON(w, 200, session.NewList(out, ""))
	return nil
}

func (s *Server) getPlugin(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.Plugins == nil {
		return pluginError(plugins.ErrNotFound)
	}
	pl, err := s.Plugins.Get(r.Context(), p.ID, r.PathValue("name"))
	if err != nil {
		return pluginError(err)
	}
	writeJSON(w, 200, pluginObject(pl))
	return nil
}

func (s *Server) deletePlugin(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.Plugins == nil {
		return pluginError(plugins.ErrNotFound)
	}
	if err := s.Plugins.Delete(r.Context(), p.ID, r.PathValue("name")); err != nil {
		return pluginError(err)
	}
	writeJSON(w, 200, PluginDeleted{Object: "plugin", Name: r.PathValue("name"), Deleted: true})
	return nil
}
