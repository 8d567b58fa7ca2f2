package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"wb/placer"
	"wb/policies"
	"wb/quota"
	"wb/session"
	"wb/store"
)

var policyIDPattern = regexp.MustCompile(`^pol_[a-z0-9_]{1,64}(@[1-9][0-9]{0,8})?$`)

// admit runs steps 2–5 of the admission pipeline for a create request body and answers the
// session in pending, plus any warnings from the deciders.
func (s *Server) admit(ctx context.Context, p store.Project, body []byte) (*session.Session, []string, error) {
	return s.admitBody(ctx, p, body, "")
}

// admitBody is admit with the new session's id chosen by the caller ("": a new one).
func (s *Server) admitBody(ctx context.Context, p store.Project, body []byte, id string) (*session.Session, []string, error) {
	var req session.CreateRequest
	if err := decodeStrict(body, &req); err != nil {
		return nil, nil, err
	}
	return s.admitRequest(ctx, p, req, id, nil)
}

// admitRequest is admit for a decoded request (a desktop's session comes this way, with the
// id it recorded beforehand; "" makes a new one). marks are platform metadata (wb.* keys)
// added to the session once it is admitted: validation and the deciders see the request
// without them, as a caller's would be, and no patch can touch them.
//
// The rate limit, the spend caps, the concurrency slot and the write are one store script
// when the admission decision cannot depend on the slots in use (no Rego, no plugin: it
// allows everything): a create is that one round trip, then the signals of its work.
// Otherwise the decision needs the slots in use (the platform's Rego reads them), so one
// script takes the token, checks the caps and holds a slot, answering the slots held before
// it (no decider sees a create the rate limit or a cap refused, as before); the decision
// sees that count; then the session's write rides in the signals' pipeline (Store.Commit),
// or a refusal gives the slot back (Store.Release). Again one round trip before the
// signals, and the limits hold exactly: the slot is held from the count to the write.
func (s *Server) admitRequest(ctx context.Context, p store.Project, req session.CreateRequest, id string, marks map[string]string) (*session.Session, []string, error) {
	// 2. validate
	st, err := req.Validate(s.Tiers)
	if err != nil {
		s.Metrics.admission.WithLabelValues("invalid").Inc()
		return nil, nil, err
	}
	if err := s.validateRefs(ctx, p, &req); err != nil {
		s.Metrics.admission.WithLabelValues("invalid").Inc()
		return nil, nil, err
	}
	// 3. rate limit and spend caps (in the store's script, before anything is written)
	if p.RatePerSec <= 0 {
		return nil, nil, s.admissionRefusal(p, &store.RateLimitError{Wait: time.Second})
	}
	adm := store.Admission{RatePerSec: p.RatePerSec, Burst: p.Burst, CapMonth: quota.CapMonth(s.Now()), Concurrency: p.Concurrency}
	// An id made here is this create's alone; one given (an idempotency key's, a desktop's)
	// may be a retry's too, which shares the reservation and finds the session.
	fresh := id == ""
	if fresh {
		id = session.NewID("sess_", s.Now())
	}
	// 4. the admission decision point
	d := session.Decision{Allow: true}
	var resv *store.Reservation // the slot held while the decision is made
	if !s.allowsAll() {
		r, err := s.Store.Reserve(ctx, p.ID, id, req.EndUserID, adm)
		if err != nil {
			if r.Unsure() { // its script may have held a slot whose answer was lost
				s.releaseLater(r, err)
			}
			return nil, nil, s.admissionRefusal(p, err)
		}
		if r.Held() {
			resv = &r
			defer func() {
				if resv != nil { // not written: nothing of the create stays
					if err := s.Store.Release(context.WithoutCancel(ctx), *resv); err != nil {
						s.releaseLater(*resv, err)
					}
				}
			}()
		}
		if d, req, err = s.decideAdmission(ctx, p, req, r.Active); err != nil {
			return nil, nil, err
		}
		if err := r.Err(); err != nil { // the id is taken or no slot was free
			return nil, nil, s.admissionRefusal(p, err)
		}
		if r.SoftCapped {
			d.Warnings = append(d.Warnings, softCapWarning)
		}
	}
	// The request as validated above, unless something changed it since: a restore's template
	// (validateRefs) or the decision's patch. (A pinned policy's id stays far below MaxIDLen.)
	if req.RestoreFrom != "" || len(d.Patch) > 0 {
		if st, err = req.Validate(s.Tiers); err != nil {
			return nil, nil, err
		}
	}
	tpl, err := s.Catalog.Resolve(templateOrDefault(req.Template, s.Catalog))
	if err != nil {
		return nil, nil, err
	}
	// 5. reserve a slot and persist pending, in one script
	now := s.Now()
	sess := &session.Session{
		ID: id, Object: session.ObjectName, Tier: st.Tier.Number, State: session.Pending, ProjectID: p.ID,
		EndUserID: optional(req.EndUserID), Template: tpl.Ref(), Region: regionOrDefault(req.Region, s.Regions),
		Resources: st.Resources, VolumeID: optional(req.VolumeID), PolicyID: optional(req.PolicyID),
		IdleTimeoutS: st.IdleTimeoutS, MaxLifetimeS: st.MaxLifetimeS, CreatedAt: *session.At(now),
		RestoreFrom: optional(req.RestoreFrom), Metadata: withMarks(req.Metadata, marks),
		Connect: session.Connect{
			ExecURL: s.PublicURL + "/v1/sessions/" + id + "/exec",
			PTYURL:  wsURL(s.PublicURL) + "/v1/sessions/" + id + "/pty",
		},
	}
	var out store.Admitted
	if resv != nil {
		out, err = s.Store.Commit(ctx, *resv, sess)
		if err == nil {
			resv = nil
		}
		out.SoftCapped = false // warned above, with the decision
	} else {
		out, err = s.Store.Admit(ctx, sess, adm)
	}
	if fresh && errors.Is(err, store.ErrExists) {
		// An id made for this create exists only if this create wrote it: go-redis sent the
		// write again after its answer was lost, and the second found the first's session.
		out, err = s.writtenUnanswered(ctx, p, id)
		if err == nil {
			resv = nil
		}
	}
	if err != nil {
		if writeUnanswered(err) { // the session may be written, with nobody to know its id
			s.abandonLater(p, id, fresh, err)
		}
		return nil, nil, s.admissionRefusal(p, err)
	}
	if out.SoftCapped {
		d.Warnings = append(d.Warnings, softCapWarning)
	}
	label := "allow"
	if len(d.Warnings) > 0 {
		label = "warn"
	}
	s.Metrics.admission.WithLabelValues(label).Inc()
	return out.Session, d.Warnings, nil
}

var softCapWarning = fmt.Sprintf("over %d%% of a monthly spend cap", quota.SoftCapPercent)

// allowsAll reports whether the admission decision is the default one, which allows every
// create unchanged whatever the request and the slots in use: it is then not asked.
func (s *Server) allowsAll() bool {
	c, ok := s.Admitter.(Chain)
	return ok && c.Policies == nil && c.Plugins == nil
}

// decideAdmission asks the admission decision point about req with active slots in use and
// answers the decision and the request with its patch applied.
func (s *Server) decideAdmission(ctx context.Context, p store.Project, req session.CreateRequest, active int64) (session.Decision, session.CreateRequest, error) {
	d, err := s.Admitter.Admit(ctx, session.AdmissionInput{Request: req, ProjectID: p.ID,
		Plan: session.Plan{Concurrency: p.Concurrency, RatePerSec: p.RatePerSec}, Active: active})
	if err != nil {
		return d, req, err
	}
	if !d.Allow {
		s.Metrics.admission.WithLabelValues("deny").Inc()
		msg := strings.Join(d.Reasons, "; ")
		if msg == "" {
			msg = "denied by " + d.Decider
		}
		return d, req, &apiError{Status: 403, Type: "denied", Code: "denied", Message: msg}
	}
	if len(d.Patch) > 0 {
		if req, err = s.applyAdmissionPatch(ctx, p, req, d); err != nil {
			s.Metrics.admission.WithLabelValues("deny").Inc()
			return d, req, err
		}
	}
	return d, req, nil
}

// admissionRefusal turns the store's refusals of a create into the API's errors and counts
// them.
func (s *Server) admissionRefusal(p store.Project, err error) error {
	var re *store.RateLimitError
	var se *store.SpendCapError
	var ce *store.ConcurrencyError
	switch {
	case errors.As(err, &re):
		s.Metrics.admission.WithLabelValues("rate_limited").Inc()
		return &apiError{Status: 429, Type: "rate_limited", Code: "rate_limited", RetryAfter: re.Wait,
			Message: fmt.Sprintf("project over its rate of %d creates/s; retry after %s", p.RatePerSec, re.Wait.Round(time.Millisecond))}
	case errors.As(err, &se):
		s.Metrics.admission.WithLabelValues("spend_capped").Inc()
		return spendCapReached(se.Scope)
	case errors.As(err, &ce):
		s.Metrics.admission.WithLabelValues("concurrency_limited").Inc()
	}
	return err
}

// spendCapReached is the 402 of a spend cap that stops admissions (and resumes) in scope
// ("project" or "end_user"): the hard cap, or the soft one whose spend decision denied them.
func spendCapReached(scope string) error {
	return &apiError{Status: 402, Type: "spend_cap_reached", Code: "spend_cap_reached",
		Message: fmt.Sprintf("the %s's monthly spend cap is reached; raise it with PUT /v1/limits", strings.ReplaceAll(scope, "_", " "))}
}

// withMarks answers meta with the platform's marks added, in a new map.
func withMarks(meta, marks map[string]string) map[string]string {
	if len(marks) == 0 {
		return meta
	}
	out := make(map[string]string, len(meta)+len(marks))
	maps.Copy(out, meta)
	maps.Copy(out, marks)
	return out
}

// checkRestorable refuses the restore of a memory snapshot that no live node can do: its memory
// needs the root disk image its guest ran on (session.SnapshotRecord.RootImage), and the placer
// places the restore only on a node of the session's region, offering its tier, that has that
// image (store.NodeInfo.Images; placer.CanHost, the placer's own rule); with none, the session
// would wait pending until its provisioning deadline failed it. A snapshot that names no image
// (disk only, another back end's, or taken by an earlier wb) is restored anywhere. (The check
// reads the nodes as they are now: one that leaves before the placement leaves the session
// pending until its deadline, as any session with no room.)
func (s *Server) checkRestorable(ctx context.Context, snap session.SnapshotRecord, region string, tier int) error {
	if !snap.IncludeMemory || snap.RootImage == "" {
		return nil
	}
	nodes, err := s.Store.Nodes(ctx)
	if err != nil {
		return err
	}
	now := s.Now()
	for _, n := range nodes {
		if placer.CanHost(n, region, tier, snap.RootImage, now, s.NodeTimeout) {
			return nil
		}
	}
	// A 400 on restore_from, as a snapshot not ready is: the create's 409 is the
	// Idempotency-Key's alone (openapi.json).
	return errInvalid("restore_from", "snapshot %s holds its guest's memory, which only a node with the root disk image "+
		"the guest ran on can restore, and no live node has that image among those of region %q that offer tier %d (the "+
		"node that took the snapshot is gone, or runs another wb since an upgrade)", snap.ID, region, tier)
}

// validateRefs checks the fields that name other things: template, region, policy, snapshot.
func (s *Server) validateRefs(ctx context.Context, p store.Project, req *session.CreateRequest) error {
	var snap session.SnapshotRecord // the restore's, when there is one
	if req.RestoreFrom != "" {
		if err := s.Store.GetObject(ctx, p.ID, store.KindSnapshot, req.RestoreFrom, &snap); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return errInvalid("restore_from", "no snapshot %q in this project", req.RestoreFrom)
			}
			return err
		}
		if snap.State != session.SnapshotReady {
			return errInvalid("restore_from", "snapshot %s is %s, not ready", snap.ID, snap.State)
		}
		if req.Template == "" {
			req.Template = snap.Template
		}
	}
	if _, err := s.Catalog.Resolve(templateOrDefault(req.Template, s.Catalog)); err != nil {
		return err
	}
	if req.Region != "" && !contains(s.Regions, req.Region) {
		return errInvalid("region", "unknown region %q; available: %s", req.Region, strings.Join(s.Regions, ", "))
	}
	// After the region's check: the restore needs a node of the session's region and tier.
	// (Validate, before this, requires the tier.)
	if req.RestoreFrom != "" && req.Tier != nil {
		if err := s.checkRestorable(ctx, snap, regionOrDefault(req.Region, s.Regions), *req.Tier); err != nil {
			return err
		}
	}
	if req.PolicyID != "" {
		if !policyIDPattern.MatchString(req.PolicyID) {
			return errInvalid("policy_id", "must look like pol_name@N (a policy version) or pol_name (its latest), got %q", req.PolicyID)
		}
		if s.Policies != nil {
			// Pin the exact version: the session keeps it for its whole life (and Pin keeps it
			// from being trimmed until the session is written).
			v, err := s.Policies.Pin(ctx, p.ID, req.PolicyID)
			if err != nil {
				if errors.Is(err, policies.ErrNotFound) || errors.Is(err, policies.ErrInvalid) {
					return errInvalid("policy_id", "no policy %q in this project", req.PolicyID)
				}
				return err
			}
			req.PolicyID = v.ID
		}
	}
	return nil
}

func templateOrDefault(t string, c session.Catalog) string {
	if t == "" {
		return c[0].Name
	}
	return t
}

func regionOrDefault(r string, regions []string) string {
	if r == "" {
		return regions[0]
	}
	return r
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func wsURL(u string) string {
	if rest, ok := strings.CutPrefix(u, "https://"); ok {
		return "wss://" + rest
	}
	return "ws://" + strings.TrimPrefix(u, "http://")
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	// With an Idempotency-Key the session is named after the key's claim, which every
	// request holding the key in turn shares: a retry that took the key over from a gateway
	// that died mid-create answers the session that one made, if it made it, instead of a
	// second one.
	var id string
	if ir := idemRefOf(ctx); ir.ref != "" {
		id = "sess_" + ir.ref
		if ir.resumed {
			if sess, err := s.Store.Get(ctx, p.ID, id); err == nil {
				return s.writeSession(ctx, w, 201, sess)
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
	}
	sess, warnings, err := s.admitBody(ctx, p, body, id)
	if id != "" && errors.Is(err, store.ErrExists) { // made by the dead request meanwhile
		if sess, err = s.Store.Get(ctx, p.ID, id); err == nil {
			return s.writeSession(ctx, w, 201, sess)
		}
	}
	if err != nil {
		return err
	}
	for _, warn := range warnings {
		w.Header().Add("Warning", `299 wb "`+strings.ReplaceAll(warn, `"`, `'`)+`"`)
	}
	return s.writeSession(r.Context(), w, 201, sess)
}

func (s *Server) loadSession(ctx context.Context, p store.Project, id string) (*session.Session, error) {
	sess, err := s.Store.Get(ctx, p.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errNotFound("session", id)
	}
	return sess, err
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request, p store.Project) error {
	sess, err := s.loadSession(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return s.writeSession(r.Context(), w, 200, sess)
}

func queryLimit(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > store.MaxListLimit {
		return 0, errInvalid("limit", "limit must be an integer 1–%d, got %q", store.MaxListLimit, v)
	}
	return n, nil
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request, p store.Project) error {
	q := r.URL.Query()
	limit, err := queryLimit(r)
	if err != nil {
		return err
	}
	lq := store.ListQuery{Limit: limit, Cursor: q.Get("cursor"), EndUserID: q.Get("end_user_id")}
	if st := q.Get("state"); st != "" {
		if lq.State, err = session.ParseState("state", st); err != nil {
			return err
		}
	}
	page, err := s.Store.List(r.Context(), p.ID, lq)
	if err != nil {
		return err
	}
	for i, sess := range page.Sessions {
		if page.Sessions[i], err = s.withConnectToken(r.Context(), sess); err != nil {
			return err
		}
	}
	writeJSON(w, 200, session.NewList(page.Sessions, page.NextCursor))
	return nil
}

// patchSession changes a session's timers. The node that runs the guest enforces them, so it
// hears of them first and the store records them only once the node has applied them: a node
// that refuses leaves both with the old timers, and a store write that loses a race re-reads
// and hands the node the re-applied timers before writing again, so the last timers each side
// got are the same. (Writing the store first and rolling it back on a refusal would show
// timers no node ever enforced in between, and its rollback could itself lose a race.)
func (s *Server) patchSession(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req session.PatchRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	ctx := r.Context()
	for attempt := 0; ; attempt++ {
		sess, err := s.loadSession(ctx, p, r.PathValue("id"))
		if err != nil {
			return err
		}
		if sess.State.Terminal() || sess.State == session.Stopping {
			return errState("session is %s; its timers can no longer change", sess.State)
		}
		next, err := session.ApplyPatch(s.Tiers, *sess, req, s.Now())
		if err != nil {
			return err
		}
		// A session not placed yet has no node: the placer hands its node the stored timers.
		told := s.Guests != nil && sess.NodeID != ""
		if told {
			if err := s.Guests.Retime(ctx, &next); err != nil {
				return s.errNode(ctx, "node_error", fmt.Sprintf("the node could not apply the new timers (the session is %s)", sess.State), err)
			}
		}
		out, err := s.Store.SetTimers(ctx, &next)
		var ce *store.ConflictError
		if errors.As(err, &ce) && !ce.Current.Terminal() && attempt < 5 {
			continue // changed under us: re-read, re-apply, and tell the node again
		}
		if err != nil {
			if told {
				s.restoreTimers(ctx, sess)
			}
			return err
		}
		return s.writeSession(ctx, w, 200, out)
	}
}

// restoreTimers hands the node back the timers the store holds for sess (those it held before
// a PATCH whose store write failed after the node applied the new ones).
func (s *Server) restoreTimers(ctx context.Context, sess *session.Session) {
	ctx = context.WithoutCancel(ctx)
	cur, err := s.Store.Get(ctx, sess.ProjectID, sess.ID)
	if err != nil {
		cur = sess // the write failed, so the store most likely still holds what was read
	}
	if cur.State.Terminal() {
		return
	}
	if err := s.Guests.Retime(ctx, cur); err != nil {
		s.log.ErrorContext(ctx, "PATCH: the node may keep timers the store does not hold", "session", sess.ID, "node", sess.NodeID, "err", err)
	}
}

// stop moves a session towards its end for reason by driver and asks the node to tear it
// down. It retries when the state changed under it.
func (s *Server) stop(ctx context.Context, p store.Project, id string) (*session.Session, int, error) {
	for attempt := 0; ; attempt++ {
		sess, err := s.loadSession(ctx, p, id)
		if err != nil {
			return nil, 0, err
		}
		switch sess.State {
		case session.Stopped, session.Failed, session.Expired:
			return sess, 200, nil
		case session.Stopping:
			return sess, 202, nil
		case session.Snapshotting:
			return nil, 0, errState("session is snapshotting; delete it when the snapshot is done")
		}
		to, err := session.Next(sess.State, session.Caller, session.Deleted)
		if err != nil {
			return nil, 0, err
		}
		out, err := s.Store.Transition(ctx, store.Change{Project: p.ID, ID: id, From: sess.State, To: to,
			Driver: session.Caller, Reason: session.Deleted})
		s.forgetSessions(p.ID)
		var ce *store.ConflictError
		if errors.As(err, &ce) && attempt < 5 {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		if to == session.Stopping {
			s.teardown(out)
			return out, 202, nil
		}
		return out, 200, nil
	}
}

// teardown asks the node to stop the guest, in the background: the node ends the session.
func (s *Server) teardown(sess *session.Session) {
	if s.Guests == nil {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		defer cancel()
		if err := s.Guests.Stop(ctx, sess); err != nil {
			s.log.Error("teardown", "session", sess.ID, "err", err)
		}
	}()
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, p store.Project) error {
	out, status, err := s.stop(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	return s.writeSession(r.Context(), w, status, out)
}

// sessionAction serves POST /v1/sessions/{id}:pause, :resume and :snapshot.
func (s *Server) sessionAction(w http.ResponseWriter, r *http.Request, p store.Project) error {
	id, action, ok := strings.Cut(r.PathValue("id"), ":")
	if !ok {
		return &apiError{Status: 404, Type: "not_found", Code: "no_route", Message: "POST /v1/sessions/{id} needs an action: :pause, :resume or :snapshot"}
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	sess, err := s.loadSession(r.Context(), p, id)
	if err != nil {
		return err
	}
	switch action {
	case "pause":
		return s.pause(w, r, sess, body)
	case "resume":
		return s.resume(w, r, sess, body)
	case "snapshot":
		return s.snapshot(w, r, sess, body)
	}
	return &apiError{Status: 404, Type: "not_found", Code: "no_route", Message: fmt.Sprintf("unknown action %q; use :pause, :resume or :snapshot", action)}
}

func emptyBody(b []byte) error {
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	var v struct{}
	return decodeStrict(b, &v)
}

func (s *Server) guests() (Guests, error) {
	if s.Guests == nil {
		return nil, &apiError{Status: 503, Type: "api_error", Code: "no_node", Message: "no node is attached to this deployment"}
	}
	return s.Guests, nil
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, sess *session.Session, body []byte) error {
	if err := emptyBody(body); err != nil {
		return err
	}
	if t, _ := s.Tiers.Tier(sess.Tier); !t.CanPause {
		return errState("tier %d sessions cannot pause; pause needs tier 2–4", sess.Tier)
	}
	if sess.State != session.Running {
		return errState("session is %s; only a running session can pause", sess.State)
	}
	g, err := s.guests()
	if err != nil {
		return err
	}
	if err := g.Pause(r.Context(), sess); err != nil {
		return s.errNode(r.Context(), "node_error", "the node could not pause the guest", err)
	}
	out, err := s.Store.Transition(r.Context(), store.Change{Project: sess.ProjectID, ID: sess.ID,
		From: session.Running, To: session.Paused, Driver: session.Caller, Version: sess.Version})
	s.forgetSessions(sess.ProjectID) // ext_authz refuses the paused session from now on
	if err != nil {
		_ = g.Resume(context.WithoutCancel(r.Context()), sess) // the state moved on: undo
		return err
	}
	return s.writeSession(r.Context(), w, 200, out)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request, sess *session.Session, body []byte) error {
	if err := emptyBody(body); err != nil {
		return err
	}
	if sess.State != session.Paused {
		return errState("session is %s; only a paused session can resume", sess.State)
	}
	// Past a hard cap a resume is refused as a create is: the cap's stop would miss a session
	// resumed while it stops the others.
	endUser := ""
	if sess.EndUserID != nil {
		endUser = *sess.EndUserID
	}
	scope, _, err := s.Accounts.CapState(r.Context(), sess.ProjectID, endUser, s.Now())
	if err != nil {
		return err
	}
	if scope != "" {
		return spendCapReached(scope)
	}
	g, err := s.guests()
	if err != nil {
		return err
	}
	if err := g.Resume(r.Context(), sess); err != nil {
		return s.errNode(r.Context(), "node_error", "the node could not resume the guest", err)
	}
	out, err := s.Store.Transition(r.Context(), store.Change{Project: sess.ProjectID, ID: sess.ID,
		From: session.Paused, To: session.Running, Driver: session.Caller, Version: sess.Version})
	s.forgetSessions(sess.ProjectID)
	if err != nil {
		return err
	}
	return s.writeSession(r.Context(), w, 200, out)
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, sess *session.Session, body []byte) error {
	var req struct {
		IncludeMemory bool `json:"include_memory"`
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := decodeStrict(body, &req); err != nil {
			return err
		}
	}
	// With an Idempotency-Key the snapshot is named after the key's ref, which every request
	// holding the key in turn shares: a retry that took the key over from a gateway that died
	// mid-snapshot answers the snapshot that one took (as the recovery recorded it, when that
	// gateway died before it could), rather than take a second.
	id := ""
	if ir := idemRefOf(r.Context()); ir.ref != "" {
		id = "snap_" + ir.ref
		if ir.resumed {
			var err error
			if sess, err = s.snapshotTaken(r.Context(), w, sess, id); sess == nil || err != nil {
				return err
			}
		}
	}
	if sess.State != session.Running {
		return errState("session is %s; only a running session can be snapshotted", sess.State)
	}
	snap, err := s.takeSnapshotAs(r.Context(), sess, id, req.IncludeMemory)
	if err != nil {
		return err
	}
	writeJSON(w, 201, snap)
	return nil
}

// snapshotTaken answers snapshot id as its request did (201), if it was recorded, and then
// nil. A session still snapshotting may be taking it for a request whose gateway died: it is
// waited for (a recovery ends it within the work lease) before it is looked for again. It
// answers the session as it is then, when there is no such snapshot.
func (s *Server) snapshotTaken(ctx context.Context, w http.ResponseWriter, sess *session.Session, id string) (*session.Session, error) {
	// A look every pollSnapshotting while the session snapshots costs one Redis GET.
	const pollSnapshotting = 100 * time.Millisecond
	deadline := time.Now().Add(2 * s.workLease())
	for {
		var snap session.Snapshot
		err := s.Store.GetObject(ctx, sess.ProjectID, store.KindSnapshot, id, &snap)
		if err == nil {
			writeJSON(w, 201, snap)
			return nil, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		if sess.State != session.Snapshotting || time.Now().After(deadline) {
			return sess, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pollSnapshotting):
		}
		if sess, err = s.Store.Get(ctx, sess.ProjectID, sess.ID); err != nil {
			return nil, err
		}
	}
}

// takeSnapshot snapshots a running session (running → snapshotting → running), records the
// snapshot and appends snapshot.ready. A desktop's sleep and stop come this way too.
func (s *Server) takeSnapshot(ctx context.Context, sess *session.Session, includeMemory bool) (session.Snapshot, error) {
	return s.takeSnapshotAs(ctx, sess, "", includeMemory)
}

// takeSnapshotAs is takeSnapshot of a snapshot named id ("" names a new one).
func (s *Server) takeSnapshotAs(ctx context.Context, sess *session.Session, id string, includeMemory bool) (session.Snapshot, error) {
	if id == "" {
		id = session.NewID("snap_", s.Now())
	}
	g, err := s.guests()
	if err != nil {
		return session.Snapshot{}, err
	}
	proj, err := s.snapshotRoom(ctx, sess.ProjectID)
	if err != nil {
		return session.Snapshot{}, err
	}
	snap := session.Snapshot{ID: id, Object: "snapshot", SessionID: sess.ID,
		State: session.SnapshotReady, CreatedAt: *session.At(s.Now()), Template: sess.Template, Tier: sess.Tier, NodeID: sess.NodeID}
	if _, err := s.Store.Transition(ctx, store.Change{Project: sess.ProjectID, ID: sess.ID,
		From: session.Running, To: session.Snapshotting, Driver: session.Caller, Version: sess.Version, Snapshot: snap.ID}); err != nil {
		return session.Snapshot{}, err
	}
	s.forgetSessions(sess.ProjectID)
	// The guest must come back to running whatever happens to the request from here.
	bg := context.WithoutCancel(ctx)
	// Should this gateway die before the session runs again, the lease lets another end the
	// snapshot (snapshot_recovery.go). Taken after the transition, so that a snapshot refused
	// (the session snapshotting already) takes no other's lease; a gateway that dies in
	// between leaves none, which the placer's sweep gives the session.
	endLease := s.holdSnapshotLease(bg, store.SessionRef{Project: sess.ProjectID, ID: sess.ID}, snap.ID)
	defer endLease(false)
	info, snapErr := g.Snapshot(bg, sess, snap.ID, includeMemory)
	snap.IncludeMemory, snap.SizeBytes = info.Memory, info.SizeBytes
	var failed *apiError
	if snapErr != nil {
		snap.State = session.SnapshotFailed
		s.log.Error("snapshot", "session", sess.ID, "err", snapErr)
		failed = s.errNode(ctx, "snapshot_failed", "the node could not take the snapshot", snapErr)
		snap.FailureReason = failed.Message // cut to maxRelayedMessage
	}
	// A snapshot that passes the plan (a 403) is not recorded; one that failed is, as failed.
	var recordErr error
	if snapErr == nil {
		recordErr = s.recordSnapshot(bg, proj, session.SnapshotRecord{Snapshot: snap, RootImage: info.RootImage})
	} else {
		recordErr = s.Store.PutObject(bg, sess.ProjectID, store.KindSnapshot, snap.ID, snap)
	}
	_, err = s.Store.Transition(bg, store.Change{Project: sess.ProjectID, ID: sess.ID,
		From: session.Snapshotting, To: session.Running, Driver: session.Caller, Snapshot: snap.ID})
	var ce *store.ConflictError
	if errors.As(err, &ce) && (ce.Current != session.Snapshotting || ce.Snapshot != "") {
		// A recovery ended the snapshot while this gateway still took it (its renewals came
		// late), or the host failed: the session moved on (and may take another snapshot
		// since, which this one must not end), and what was recorded stands.
		s.log.Warn("snapshot: the session left snapshotting before the snapshot was done", "session", sess.ID,
			"state", ce.Current, "taking", ce.Snapshot)
		err = nil
	}
	if err != nil {
		// The session is still snapshotting: the lease is left to run out (the deferred
		// endLease), and its recovery returns the session to running, recording the snapshot
		// failed unless it was recorded. (Should that fail too, the placer's sweep gives the
		// session a lease in minutes.)
		return session.Snapshot{}, errors.Join(err, recordErr)
	}
	endLease(true)
	s.forgetSessions(sess.ProjectID)
	if recordErr != nil {
		return session.Snapshot{}, recordErr
	}
	if failed != nil {
		return session.Snapshot{}, failed
	}
	if _, err := s.Store.AppendEvent(bg, sess.ProjectID, session.EventSnapshotReady, sess.ID, snap); err != nil {
		return session.Snapshot{}, err
	}
	return snap, nil
}
