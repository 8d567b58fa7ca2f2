package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"wb/session"
	"wb/store"
)

type runRequest struct {
	// A run in an existing session.
	SessionID string          `json:"session_id,omitempty"`
	Command   json.RawMessage `json:"command,omitempty"`
	// An ephemeral tier-1 run.
	Tier      *int   `json:"tier,omitempty"`
	Runtime   string `json:"runtime,omitempty"`
	Code      string `json:"code,omitempty"`
	EndUserID string `json:"end_user_id,omitempty"`
	// Both.
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	Stdin    string            `json:"stdin,omitempty"`
	TimeoutS *int              `json:"timeout_s,omitempty"`
}

// runRecordTimeout bounds the writes of a run's end (its record and its run.finished): Close
// waits for them, and a Redis that does not answer must not hold a deploy for longer.
const runRecordTimeout = 10 * time.Second

func (s *Server) createRun(w http.ResponseWriter, r *http.Request, p store.Project) error {
	t0 := time.Now()
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req runRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	wait := true
	switch v := r.URL.Query().Get("wait"); v {
	case "", "true":
	case "false":
		wait = false
	default:
		return errInvalid("wait", "wait must be true or false, got %q", v)
	}
	status := 201 // the run, ended
	if !wait {
		status = 202 // the run, queued
	}
	// With an Idempotency-Key the run and an ephemeral run's session are named after the key's
	// ref, which every request holding the key in turn shares: a retry that took the key over
	// from a gateway that died (or was merely slow) mid-run answers the run that one made
	// rather than run the command again.
	runID, sessID := "", ""
	if ir := idemRefOf(r.Context()); ir.ref != "" {
		runID, sessID = "run_"+ir.ref, "sess_"+ir.ref
		if ir.resumed {
			if run, err := s.Store.GetRun(r.Context(), p.ID, runID); err == nil {
				return s.answerRun(w, r, p, run, status, wait)
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
	}
	// The cap is taken before anything is made, so that a refused run leaves nothing behind
	// (an ephemeral run's session), and after a given session is found: a missing one is a
	// 404 however busy the project is.
	slots, max := s.execs, s.MaxConcurrentExecs
	if !wait {
		slots, max = s.asyncRuns, s.MaxAsyncRuns
	}
	held := false
	take := func() error {
		if err := slots.acquire(p.ID, max); err != nil {
			return err
		}
		held = true
		return nil
	}
	defer func() {
		if held {
			slots.release(p.ID)
		}
	}()
	exec := session.ExecRequest{Command: req.Command, Env: req.Env, Cwd: req.Cwd, Stdin: req.Stdin, TimeoutS: req.TimeoutS}
	// work runs the command of run, which the attempt owns.
	var work func(ctx context.Context, run *session.Run, attempt string) error
	ephemeral := "" // the id of the session admitted for an ephemeral run
	if req.SessionID != "" {
		if req.Tier != nil || req.Runtime != "" || req.Code != "" {
			return errInvalid("session_id", "give session_id with command, or tier 1 with runtime and code, not both")
		}
		if _, err := exec.Argv(); err != nil {
			return err
		}
		sess, err := s.loadSession(r.Context(), p, req.SessionID)
		if err != nil {
			return err
		}
		if err := take(); err != nil {
			return err
		}
		if sess.State != session.Running {
			return errState("session is %s; a run needs a running session", sess.State)
		}
		work = func(ctx context.Context, run *session.Run, attempt string) error {
			sess, err := s.Store.Get(ctx, p.ID, req.SessionID)
			if err != nil {
				return err
			}
			return s.execRun(ctx, sess, exec, run, attempt)
		}
	} else {
		if req.Tier == nil || *req.Tier != 1 {
			return errInvalid("tier", "give session_id with command, or tier: 1 with runtime and code")
		}
		if len(req.Command) > 0 {
			return errInvalid("command", "an ephemeral run takes runtime and code, not command")
		}
		if req.Code == "" {
			return errInvalid("code", "code is required for an ephemeral run")
		}
		tpl, rt, err := s.Catalog.Runtime(req.Runtime)
		if err != nil {
			return err
		}
		exec.Command, _ = json.Marshal(append(append([]string{}, rt.Argv...), req.Code))
		if _, err := exec.Argv(); err != nil {
			return err
		}
		tier := 1
		// Marked as a run's, the session gets a warm guest whose interpreter waits for the code.
		sreq, marks := session.CreateRequest{Tier: &tier, Template: tpl.Name, EndUserID: req.EndUserID}, map[string]string{session.RunMetadataKey: rt.Name}
		// Its fields (end_user_id) are checked before the cap too (admitRequest checks them
		// again): an invalid request is its 400 however busy the project is.
		if _, err := sreq.Validate(s.Tiers); err != nil {
			s.Metrics.admission.WithLabelValues("invalid").Inc()
			return err
		}
		if err := take(); err != nil {
			return err
		}
		sess, _, err := s.admitRequest(r.Context(), p, sreq, sessID, marks)
		if sessID != "" && errors.Is(err, store.ErrExists) {
			// Admitted by a request that died before its run was saved: nothing ran in it.
			// One that has ended (its run's save failed) gives way to a new one.
			if sess, err = s.Store.Get(r.Context(), p.ID, sessID); err == nil && (sess.State.Terminal() || sess.State == session.Stopping) {
				sess, _, err = s.admitRequest(r.Context(), p, sreq, "", marks)
			}
		}
		if err != nil {
			return err
		}
		admitted := time.Now()
		work = func(ctx context.Context, run *session.Run, attempt string) error {
			var ran, execd time.Time
			defer func() {
				stopAt := time.Now()
				if _, _, err := s.stop(context.WithoutCancel(ctx), p, sess.ID); err != nil {
					s.log.Error("ephemeral run: stop session", "session", sess.ID, "err", err)
				}
				// Where a run's time goes, for profiling the hot path (--log-level debug).
				s.log.Debug("ephemeral run", "session", sess.ID, "admit", admitted.Sub(t0), "to_running", durSince(ran, admitted),
					"exec", durSince(execd, ran), "stop", time.Since(stopAt))
			}()
			running, err := s.waitRunning(ctx, sess)
			if err != nil {
				return err
			}
			ran = time.Now()
			err = s.execRun(ctx, running, exec, run, attempt)
			execd = time.Now()
			return err
		}
		req.SessionID, ephemeral = sess.ID, sess.ID
	}
	now := s.Now()
	if runID == "" {
		runID = session.NewID("run_", now)
	}
	run := &session.Run{ID: runID, Object: "run", SessionID: &req.SessionID,
		State: session.RunQueued, CreatedAt: *session.At(now)}
	// The attempt holds a lease on the run until it has ended, taken before the record is
	// made: should this gateway stop first, another's recovery finds the run and ends it
	// (run_recovery.go).
	ref := store.RunRef{Project: p.ID, ID: runID, Attempt: session.NewID("lease_", now)}
	if err := s.Store.SetRunWork(r.Context(), ref, now.Add(s.workLease())); err != nil {
		if ephemeral != "" { // it will run nothing: its guest must not hold a slot until its idle timeout
			s.stopRunSession(r.Context(), p, ephemeral, err)
		}
		return err
	}
	s.runs.begin(ref, ref.Attempt)
	leased := true
	defer func() {
		if leased { // the run was not made, or perhaps was (an error after the write): its lease runs out
			s.endRunWork(ref, false)
		}
	}()
	// The record is created only where there is none: of the requests that share a run id (a
	// gateway slow enough for its Idempotency-Key's lease to lapse, and the retry that took
	// the key over from it) one makes it, and only that one runs the command.
	created, err := s.Store.CreateRun(r.Context(), p.ID, run, ref.Attempt)
	if err != nil {
		if ephemeral != "" { // it will run nothing: its guest must not hold a slot until its idle timeout
			s.stopRunSession(r.Context(), p, ephemeral, err)
		}
		return err
	}
	if !created {
		leased = false
		s.endRunWork(ref, true)
		other, err := s.Store.GetRun(r.Context(), p.ID, runID)
		if err != nil {
			return err
		}
		if ephemeral != "" && (other.SessionID == nil || *other.SessionID != ephemeral) {
			// A session of its own (the key's had ended): the other run does not use it.
			s.stopRunSession(r.Context(), p, ephemeral, nil)
		}
		return s.answerRun(w, r, p, other, status, wait)
	}
	do := func(ctx context.Context) {
		ended := false // recorded: the lease can go; until then a recovery may be needed
		defer func() { s.endRunWork(ref, ended) }()
		stopRenewing := s.keepRenewed(context.WithoutCancel(ctx), "run", run.ID, func(ctx context.Context, until time.Time) (bool, error) {
			return s.Store.RenewRunWork(ctx, ref, until)
		})
		err := work(ctx, run, ref.Attempt)
		closing := ctx.Err() != nil // only an async run's is cancelled: by its gateway's Close
		stopRenewing()
		// The end is recorded and announced even as the gateway shuts down, or the run would
		// stay running until a recovery ends it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runRecordTimeout)
		defer cancel()
		if errors.Is(err, errRunEnded) {
			// A recovery ended it, and the command never started: it stands as recorded.
			if cur, gerr := s.Store.GetRun(ctx, p.ID, run.ID); gerr == nil {
				*run = *cur
			}
			ended = true
			return
		}
		if err != nil {
			msg := toAPIError(err).Message
			if closing {
				msg = "the gateway running it shut down before it finished; run it again"
			}
			run.State, run.Error = session.RunFailed, &msg
			run.FinishedAt = session.At(s.Now())
		}
		written, err := s.Store.FinishRun(ctx, p.ID, run, ref.Attempt, eventRun(run), s.outputBudget())
		switch {
		case err != nil:
			// Its lease runs out, and a recovery records it failed.
			s.log.Error("save run", "run", run.ID, "err", err)
		case !written:
			// A recovery recorded it failed, and announced it, while this gateway was cut off
			// from Redis (its lease ran out): that end stands, and is the answer, so that the
			// run ends once, and the same to every reader.
			s.log.Warn("run: ended by a recovery while it ran here (this gateway lost its lease); its end here is dropped",
				"run", run.ID, "state", run.State)
			if cur, gerr := s.Store.GetRun(ctx, p.ID, run.ID); gerr == nil {
				*run = *cur
			} else {
				s.log.Error("read run", "run", run.ID, "err", gerr)
			}
			ended = true
		default:
			ended = true
		}
	}
	leased = false // do lets go of it
	if !wait {
		queued := *run
		s.bg.Add(1)
		held = false // the goroutine releases it
		go func() {
			defer s.bg.Done()
			defer slots.release(p.ID)
			do(s.ctx)
		}()
		writeJSON(w, status, queued)
		return nil
	}
	// A run outlives its caller's connection, as sessions do.
	do(context.WithoutCancel(r.Context()))
	writeJSON(w, status, run)
	return nil
}

// migrateLegacyRuns moves the runs saved before each had a key of its own to keys of their
// own (store.MigrateLegacyRuns), once for the whole fleet; GET moves each it reads meanwhile.
func (s *Server) migrateLegacyRuns(ctx context.Context) {
	n, err := s.Store.MigrateLegacyRuns(ctx)
	if err != nil && ctx.Err() == nil {
		s.log.Warn("legacy runs: move them to keys of their own (the next gateway to start goes on; GET moves each it reads)", "moved", n, "err", err)
	} else if n > 0 {
		s.log.Info("legacy runs moved to keys of their own", "runs", n)
	}
}

// answerRun answers run, which another request with the same Idempotency-Key made (and
// runs, or ran): as it is to a caller that does not wait, else once it has ended, as its own
// gateway records it (or, should that gateway stop first, the recovery of its lease).
func (s *Server) answerRun(w http.ResponseWriter, r *http.Request, p store.Project, run *session.Run, status int, wait bool) error {
	const poll = 200 * time.Millisecond
	for wait && !runEnded(run.State) {
		select {
		case <-r.Context().Done():
			return r.Context().Err()
		case <-time.After(poll):
		}
		var err error
		if run, err = s.Store.GetRun(r.Context(), p.ID, run.ID); err != nil {
			return err
		}
	}
	writeJSON(w, status, run)
	return nil
}

// runEnded reports whether a run in state st has ended.
func runEnded(st string) bool { return st == session.RunSucceeded || st == session.RunFailed }

// errRunEnded: a recovery ended the run before its command started (its lease ran out).
var errRunEnded = errors.New("the run was ended by a recovery before its command started")

// execRun runs the command of run, which attempt owns, in sess: it records the run running
// first, unless a recovery ended it (errRunEnded), so that the command never starts after.
func (s *Server) execRun(ctx context.Context, sess *session.Session, req session.ExecRequest, run *session.Run, attempt string) error {
	run.State, run.StartedAt = session.RunRunning, session.At(s.Now())
	started, err := s.Store.StartRun(ctx, sess.ProjectID, run, attempt)
	if err != nil {
		return err
	}
	if !started {
		return errRunEnded
	}
	res, err := s.runExec(ctx, sess, req, nil)
	if err != nil {
		return err
	}
	run.ExitCode, run.Stdout, run.Stderr, run.DurationMs = &res.ExitCode, res.Stdout, res.Stderr, &res.DurationMs
	run.Truncated, run.StdoutBytes, run.StderrBytes = res.Truncated, res.StdoutBytes, res.StderrBytes
	run.FinishedAt = session.At(s.Now())
	run.State = session.RunSucceeded
	if res.ExitCode != 0 {
		run.State = session.RunFailed
	}
	return nil
}

// stopRunSession ends the session admitted for an ephemeral run that will not run (its record
// could not be saved): at once, or, when Redis does not answer (most likely, as the save
// failed), in the background until it does, for up to abandonFor.
func (s *Server) stopRunSession(ctx context.Context, p store.Project, id string, cause error) {
	if _, _, err := s.stop(context.WithoutCancel(ctx), p, id); err == nil {
		return
	}
	started := s.retryLater(&s.abandons, time.Now().Add(abandonFor), func(ctx context.Context) error {
		_, _, err := s.stop(ctx, p, id)
		return err
	}, func(err error) {
		if err != nil {
			s.log.Warn("an unsaved run's ephemeral session runs until its idle timeout", "session", id, "err", err)
		}
	})
	if !started {
		s.log.Warn("an unsaved run's ephemeral session runs until its idle timeout: too many cleanups wait already", "session", id, "err", cause)
	}
}

// eventOutputBytes is how much of each stream a run.finished event carries. The event is
// queued once per subscribed endpoint and kept for up to a day while an endpoint fails, so a
// run's whole output (up to MaxOutputBytes per stream) would cost Redis that much again per
// endpoint; the whole output stays at GET /v1/runs/{id}.
const eventOutputBytes = 64 << 10

// eventRun is the run as its run.finished event carries it: each stream cut to
// eventOutputBytes, saying truncated, with the byte counts of the whole output.
func eventRun(run *session.Run) *session.Run {
	ev := *run
	ev.StdoutBytes = max(ev.StdoutBytes, int64(len(ev.Stdout)))
	ev.StderrBytes = max(ev.StderrBytes, int64(len(ev.Stderr)))
	ev.Stdout = session.CutOutput(ev.Stdout, eventOutputBytes)
	ev.Stderr = session.CutOutput(ev.Stderr, eventOutputBytes)
	ev.Truncated = ev.Truncated || ev.StdoutBytes > int64(len(ev.Stdout)) || ev.StderrBytes > int64(len(ev.Stderr))
	return &ev
}

// durSince is t's distance from since, 0 when t was never reached.
func durSince(t, since time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(since)
}

// waitRunning waits for a new session to run, up to its tier's provisioning deadline.
func (s *Server) waitRunning(ctx context.Context, sess *session.Session) (*session.Session, error) {
	t, _ := s.Tiers.Tier(sess.Tier)
	ctx, cancel := context.WithTimeout(ctx, t.ProvisionDeadline()+time.Second)
	defer cancel()
	// The session's start is announced (store.WatchStarts): the wait is told, and looks at the
	// session then. Registered before the first look, it misses no start after that look.
	// While the announcement holds (and was not lost since before the look), a look is only
	// a fallback, for a session started by a node of a wb that announces nothing (a rolling
	// deploy): looks spaced from runPollSlow growing to runPollMax (about 5, 11, 19, 29, 41,
	// 56, 75, 99 ms, then every 25), so such a start is seen at most runPollMax (25 ms) after
	// it, up to ~24 ms later than without the announcement (every millisecond for the first
	// 50 ms, then spaced out from runPollSlow).
	//
	// Else a warm guest runs within milliseconds: look every millisecond for the first 50. One
	// not running by then is starting cold, which takes a second or more: the looks then space
	// out (runPollSlow, a quarter longer each time, up to runPollMax), since at every 5 ms a
	// cold start on a loaded host cost hundreds of looks, each CPU of this process's and
	// Redis's taken from the guests starting. A look reads the state field alone (one HGET);
	// the whole session (HGETALL and its JSON decoding, most of a look's CPU) is read once,
	// when it runs or has ended (or was announced to).
	ref := []store.SessionRef{{Project: sess.ProjectID, ID: sess.ID}}
	var told chan struct{} // nil: not told (a nil channel never receives)
	if s.starts != nil {
		var done func()
		told, done = s.starts.add(ref[0])
		defer done()
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	began, wait := time.Now(), runPollFast
	announced := false
	for {
		var epoch uint64 // odd: the announcement holds
		if told != nil {
			epoch = s.starts.epoch.Load()
		}
		var cur *session.Session
		if announced {
			var err error
			if cur, err = s.Store.Get(ctx, sess.ProjectID, sess.ID); err != nil {
				return nil, err
			}
		} else {
			st, err := s.Store.States(ctx, ref)
			if err != nil {
				return nil, err
			}
			if !st[0].Valid() || st[0] == session.Running || st[0].Terminal() || st[0] == session.Stopping {
				// Or gone ("", which Get answers ErrNotFound) or unreadable (Get's error).
				if cur, err = s.Store.Get(ctx, sess.ProjectID, sess.ID); err != nil {
					return nil, err
				}
			} else {
				cur = &session.Session{ID: sess.ID, State: st[0]}
			}
		}
		switch {
		case cur.State == session.Running:
			return cur, nil
		case cur.State.Terminal() || cur.State == session.Stopping:
			reason := "unknown"
			if cur.StateReason != nil {
				reason = string(*cur.StateReason)
			}
			return nil, &apiError{Status: 502, Type: "api_error", Code: "session_failed", Message: fmt.Sprintf("the run's session %s ended (%s) before it ran", cur.ID, reason)}
		}
		heard := epoch%2 == 1 && s.starts.epoch.Load() == epoch
		if heard || time.Since(began) > runPollFastFor {
			wait = min(max(wait*5/4, runPollSlow), runPollMax)
		} else {
			wait = runPollFast // (again, should the announcement be lost within the first 50 ms)
		}
		timer.Reset(wait)
		announced = false
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, &apiError{Status: 504, Type: "api_error", Code: "provision_timeout", Message: fmt.Sprintf("session %s did not start within %s", sess.ID, t.ProvisionDeadline())}
		case <-timer.C:
		case <-told:
			timer.Stop()
			// Announced, unless the subscription was lost (which wakes every wait).
			announced = heard && s.starts.epoch.Load() == epoch
		}
	}
}

// waitRunning's looks at a new session: every runPollFast for runPollFastFor, then from
// runPollSlow growing to runPollMax, which bounds how late a cold start is seen (25 ms of one
// that takes a second or more); from runPollSlow at once while its start is announced.
const (
	runPollFast    = time.Millisecond
	runPollFastFor = 50 * time.Millisecond
	runPollSlow    = 5 * time.Millisecond
	runPollMax     = 25 * time.Millisecond
)

func (s *Server) getRun(w http.ResponseWriter, r *http.Request, p store.Project) error {
	run, err := s.Store.GetRun(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return errNotFound("run", r.PathValue("id"))
		}
		return err
	}
	writeJSON(w, 200, run)
	return nil
}
