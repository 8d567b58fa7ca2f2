package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"wb/session"
	"wb/store"
)

// Stopper tears down a session's guest once it is stopping (the node's client).
type Stopper interface {
	Stop(ctx context.Context, s *session.Session) error
}

// SpendDecision is what the spend decision point says about a crossed cap.
type SpendDecision struct {
	Stop bool // stop the running sessions in scope
	// StopProject widens Stop to every session of the project when the crossed cap is one
	// end user's: a tenant's decider may judge that one user's overspend stops them all.
	StopProject   bool
	DenyAdmission bool     // answer new admissions in scope with 402
	Warnings      []string // logged, and sent with quota.exceeded
}

// Enforcer acts on crossed caps: it asks the spend decision point, stops the sessions in
// scope (stopping → stopped, reason spend_cap, driver metering), fires quota.exceeded once,
// and leaves the admission stop in place unless the decision lifts it; at the soft level it
// sets one when the decision denies admissions.
type Enforcer struct {
	Store *store.Store
	// Accounts lifts the admission stop when the decision lets admissions go on (or sets it,
	// at the soft level, when the decision denies them).
	Accounts *Accounts
	Stopper  Stopper
	// Decide is the spend decision point (Rego and plugins); nil means the default: a hard cap
	// stops the sessions in scope and denies admissions; a soft cap only warns.
	Decide func(ctx context.Context, ev CapEvent) (SpendDecision, error)
	Logger *slog.Logger

	mu      sync.Mutex
	waiting map[string]bool // project/session → a wait for its snapshot is running (stopOne)
}

// OnCap is the Caps callback. A crossing Caps held undecided is decided only if its
// undecided stop is still the one Caps wrote, taken over first as a later round takes it
// (decideLeftOver): that round decides it once the settler that flagged it is late, and a
// raised cap deletes it; either way, deciding it here would decide it twice, or decide a
// cap no longer crossed.
func (e *Enforcer) OnCap(ctx context.Context, ev CapEvent) { e.onCapAt(ctx, ev, time.Now()) }

// onCapAt is OnCap at now.
func (e *Enforcer) onCapAt(ctx context.Context, ev CapEvent, now time.Time) {
	log := e.Logger
	if log == nil {
		log = slog.Default()
	}
	if ev.undecided != "" {
		took, err := e.takeUndecided(ctx, &ev, now)
		if err != nil {
			log.Error("spend cap: take the undecided stop; a later round decides the cap", "project", ev.Project, "end_user", ev.EndUser, "err", err)
			return
		}
		if !took {
			log.Info("spend cap: the crossing was decided by another round, or the cap raised", "project", ev.Project, "end_user", ev.EndUser)
			return
		}
	}
	e.decide(ctx, ev, now, log)
}

// takeUndecided takes over ev's undecided stop if it is still ev.undecided, marking it as
// being decided until undecidedWait from now (other rounds leave it alone until then), and
// answers whether it did; ev.undecided becomes the stop as taken. A stop whose cap is no
// longer crossed (its flag and lifted mark gone: a raise by a binary older than the undecided
// stops, which leaves them) is dropped instead.
func (e *Enforcer) takeUndecided(ctx context.Context, ev *CapEvent, now time.Time) (bool, error) {
	var stop heldStop
	if err := json.Unmarshal([]byte(ev.undecided), &stop); err != nil {
		return false, fmt.Errorf("undecided stop of %s: %w", ev.Project, err)
	}
	by := now.Add(undecidedWait)
	stop.DecideBy = &by
	b, err := json.Marshal(stop)
	if err != nil {
		return false, err
	}
	crossed := []string{capFlag(ev.Project, ev.EndUser, ev.Level, ev.Month)}
	if ev.Level == "hard" {
		crossed = append(crossed, capLifted(ev.Project, ev.EndUser, ev.Month))
	}
	took, err := e.Store.ReplaceCapUndecided(ctx, ev.Project, undecidedStopID(ev.EndUser, ev.Month, ev.Level), ev.undecided, string(b), crossed)
	if err != nil || !took {
		return false, err
	}
	ev.undecided, ev.crossing = string(b), stop.CrossedAt
	return true, nil
}

// decide asks the spend decision point about ev's crossed cap and acts on its answer; a
// crossing Caps held undecided is taken over by then (OnCap, decideLeftOver). One decided
// after its month (its settler died in the month's last minutes) is acted on as it would
// have been, its event sent and the sessions live at the crossing stopped; those created
// since were admitted in the new month, under its own caps. One flagged after its month (a
// record of it settled late) stops the sessions live at the month's end.
func (e *Enforcer) decide(ctx context.Context, ev CapEvent, now time.Time, log *slog.Logger) {
	d := SpendDecision{Stop: ev.Level == "hard", DenyAdmission: ev.Level == "hard"}
	if e.Decide != nil {
		var err error
		if d, err = e.Decide(ctx, ev); err != nil {
			log.Error("spend decision failed; applying the default", "err", err)
			d = SpendDecision{Stop: ev.Level == "hard", DenyAdmission: ev.Level == "hard"}
		}
	}
	if ev.Level == "hard" && !d.DenyAdmission {
		if e.Accounts == nil {
			log.Error("spend decision lets admissions go on, but the enforcer has no Accounts to lift the stop with", "project", ev.Project)
		} else if err := e.Accounts.liftStop(ctx, ev); err != nil {
			log.Error("spend decision: lift the admission stop", "project", ev.Project, "end_user", ev.EndUser, "err", err)
		}
	}
	if ev.Level == "soft" && d.DenyAdmission {
		// A deny at the soft level (a plugin's, or a failure of one not fail-open) refuses
		// new sessions in the figure's scope as the hard cap does, by the same flag.
		if e.Accounts == nil {
			log.Error("spend decision denies admissions at the soft cap, but the enforcer has no Accounts to stop them with", "project", ev.Project)
		} else if err := e.Accounts.stopAdmissions(ctx, ev); err != nil {
			log.Error("spend decision: stop admissions at the soft cap", "project", ev.Project, "end_user", ev.EndUser, "err", err)
		}
	}
	if ev.Level == "hard" {
		obj := map[string]any{"object": "quota", "project_id": ev.Project, "scope": ev.Scope, "level": ev.Level,
			"spend_micro_usd": ev.SpendMicroUSD, "cap_micro_usd": ev.CapMicroUSD, "month": ev.Month,
			"sessions_stopped": d.Stop, "admissions_denied": d.DenyAdmission, "warnings": d.Warnings}
		if ev.EndUser != "" {
			obj["end_user_id"] = ev.EndUser
		}
		// Its id and time are the crossing's (zero, for one without an undecided stop: a
		// new id, now), the same however often it is decided.
		if _, err := e.Store.AppendEventID(ctx, ev.Project, capEventID(ev), ev.crossing, session.EventQuotaExceeded, "", obj); err != nil {
			log.Error("quota.exceeded event", "err", err)
		}
	}
	if d.Stop {
		scope := ev
		if d.StopProject {
			scope.EndUser = ""
		}
		crossed, past := ev.crossedAt, ev.Month < monthOf(now)
		if crossed.IsZero() && past {
			// The settler's own act, in the next month: the crossing's time, not the act's,
			// bounds its stop (sessions were admitted in between, under the new month's caps).
			crossed = ev.crossing
		}
		if crossed.IsZero() {
			crossed = now
		}
		var createdBy time.Time
		if past {
			// A record of the month settled after its end flags the cap then, in the new
			// month: the crossing is still its month's, and the sessions admitted since the
			// month's end were admitted under the new month's caps.
			if m, err := time.Parse("200601", ev.Month); err == nil && crossed.After(monthEnd(m)) {
				crossed = monthEnd(m)
			}
			createdBy = crossed
		}
		if !e.stopScope(ctx, scope, createdBy, stopPasses, log) {
			e.holdStop(ctx, ev, heldStop{CapEvent: scope, CrossedAt: crossed}, log)
		}
	}
	if ev.undecided != "" {
		// Decided (and its stop held, if one is left): the stop Caps held until then goes.
		if err := e.Store.EndCapUndecided(ctx, ev.Project, undecidedStopID(ev.EndUser, ev.Month, ev.Level), ev.undecided); err != nil {
			log.Error("spend cap: drop the undecided stop; a later round decides the cap again", "project", ev.Project, "end_user", ev.EndUser, "err", err)
		}
	}
}

// capEventID answers the id of the quota.exceeded of ev's crossing: derived from the
// crossing (project, end user, level, month and when its undecided stop says it was crossed),
// so that a crossing decided again (its decision's end not recorded: the event is sent at
// least once) sends the same event, which its receivers deduplicate by id. A crossing without
// an undecided stop (none to decide it again) has a new id.
func capEventID(ev CapEvent) string {
	if ev.crossing.IsZero() {
		return ""
	}
	key := strings.Join([]string{session.EventQuotaExceeded, ev.Project, ev.Scope, ev.EndUser, ev.Level, ev.Month,
		strconv.FormatInt(ev.crossing.UnixNano(), 10)}, "\x00")
	return session.DerivedID("evt_", ev.crossing, key)
}

// capStopID names the stop of the hard cap ev crossed among the project's held stops
// (CapStops), and starts the names of its other stops (heldStopID, undecidedStopID).
func capStopID(endUser, month string) string {
	if endUser == "" {
		return month
	}
	return month + ":eu:" + endUser
}

// heldStopID names the held stop of the cap of level crossed among the project's held stops
// (CapStops). A soft cap's is named apart (…:soft): under one name, a soft and a hard
// decision of one scope and month replaced each other's stop, and the sessions only the
// replaced one covered ran on. Binaries older than it carry a soft one on as any held stop
// (they read the stop, not its name), and do not drop it on a raise.
func heldStopID(endUser, month, level string) string {
	if level == "soft" {
		return capStopID(endUser, month) + ":soft"
	}
	return capStopID(endUser, month)
}

// undecidedStopID names the undecided stop of the cap of level crossed among the project's
// undecided stops (CapUndecided): the one Caps holds with the cap's flag until OnCap has
// decided it. A soft cap's is named apart (…:soft:undecided): binaries older than the soft
// ones take a stop over only under the hard cap's name, so they leave it alone.
func undecidedStopID(endUser, month, level string) string {
	if level == "soft" {
		return capStopID(endUser, month) + ":soft:undecided"
	}
	return capStopID(endUser, month) + ":undecided"
}

// heldStop is a stop held for a later round (holdStop): the scope the decision stopped, and
// when the cap was crossed. The sessions created after that are not the decision's: they
// were admitted afterwards, when the decision let admissions go on (or a raised cap did).
//
// An undecided one is the cap's crossing itself (a hard or a soft cap's; a soft one stops
// nothing unless its decision says so), held by Caps with the cap's flag until
// OnCap decides it: a later round decides it (OnCap) if it is still there undecidedWait after
// the crossing (the settler that crossed the cap died before acting on it), or after
// DecideBy, when another round took it over.
type heldStop struct {
	CapEvent
	CrossedAt time.Time  `json:"crossed_at"`
	Undecided bool       `json:"undecided,omitempty"`
	DecideBy  *time.Time `json:"decide_by,omitempty"`
}

// undecidedWait is how long after a crossing a later round leaves its undecided stop to the
// settler that crossed it: that one decides it when its settle of the project ends, and then
// within capActTimeout.
const undecidedWait = 2 * capActTimeout

// holdStop records the stop the decision ordered for ev's crossed cap when its passes left
// sessions live: the cap's flag is set once a month, so without it nothing would try again,
// and the sessions would run on past the cap. RetryStops carries it on.
func (e *Enforcer) holdStop(ctx context.Context, ev CapEvent, stop heldStop, log *slog.Logger) {
	b, err := json.Marshal(stop)
	if err == nil {
		err = e.Store.HoldCapStop(ctx, ev.Project, heldStopID(ev.EndUser, ev.Month, ev.Level), string(b), capFlagTTL)
	}
	if err != nil {
		log.Error("spend cap: hold the stop for a later round; the sessions left live run on", "project", ev.Project, "end_user", ev.EndUser, "err", err)
	}
}

// RetryStops carries on the stops that crossed caps ordered and left unfinished (holdStop):
// one pass each, dropping the stops that leave nothing live in scope. The stops stand as
// decided when the cap was crossed, over the sessions created by then, past the month's end
// too (a crossing in its last seconds would leave its sessions running otherwise; those
// created since are not its), and a raised cap drops them (Accounts). A stop of a month past
// without its crossing's time (none is written so) would stop the new month's sessions: it is
// dropped. It decides the crossings their settler left undecided (decideLeftOver), whatever
// their month. The settler calls it every few seconds; while no stop is held it costs two
// commands.
func (e *Enforcer) RetryStops(ctx context.Context, now time.Time) error {
	log := e.Logger
	if log == nil {
		log = slog.Default()
	}
	var errs []error
	undecided, err := e.Store.CapUndecidedProjects(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range undecided {
		stops, err := e.Store.CapUndecided(ctx, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		left := 0
		for id, v := range stops {
			var stop heldStop
			if json.Unmarshal([]byte(v), &stop) == nil {
				// Whatever its month: a crossing in the month's last minutes is decided in
				// the next, and its event and stops are not lost with the month.
				if err := e.decideLeftOver(ctx, v, stop, now); err != nil {
					errs = append(errs, err)
				}
				left++ // decided, it is dropped: the next round sees it gone
				continue
			}
			if err := e.Store.EndCapUndecided(ctx, p, id, v); err != nil {
				errs = append(errs, err)
				left++
			}
		}
		if left == 0 {
			if err := e.Store.ForgetCapUndecidedProject(ctx, p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	projects, err := e.Store.CapStopProjects(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, p := range projects {
		stops, err := e.Store.CapStops(ctx, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		left := 0
		for id, v := range stops {
			var stop heldStop
			ok := json.Unmarshal([]byte(v), &stop) == nil && (stop.Month >= monthOf(now) || !stop.CrossedAt.IsZero())
			if ok && !e.stopScope(ctx, stop.CapEvent, stop.CrossedAt, 1, log) {
				left++
				continue
			}
			if err := e.Store.EndCapStop(ctx, p, id, v); err != nil {
				errs = append(errs, err)
				left++
			}
		}
		if left == 0 {
			if err := e.Store.ForgetCapStopProject(ctx, p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// decideLeftOver decides the crossed cap whose undecided stop v its settler left (it
// died after flagging the cap), once it is due: it takes the stop over for a while, so that
// other rounds leave it alone meanwhile, and acts as that settler would have (OnCap), under a
// context of its own as the settler does.
func (e *Enforcer) decideLeftOver(ctx context.Context, v string, stop heldStop, now time.Time) error {
	due := stop.CrossedAt.Add(undecidedWait)
	if stop.DecideBy != nil {
		due = *stop.DecideBy
	}
	if now.Before(due) {
		return nil
	}
	ev := stop.CapEvent
	ev.undecided, ev.crossedAt = v, stop.CrossedAt
	took, err := e.takeUndecided(ctx, &ev, now)
	if err != nil || !took {
		return err
	}
	log := e.Logger
	if log == nil {
		log = slog.Default()
	}
	actCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), capActTimeout)
	defer cancel()
	e.decide(actCtx, ev, now, log)
	return nil
}

// liveStates are the states stopScope stops sessions in.
var liveStates = []session.State{session.Pending, session.Provisioning, session.Running, session.Paused, session.Snapshotting}

// stopPasses bounds the passes of one crossed cap's stop: a pass that left a session live
// (its stop failed: Redis away a moment, or its state kept moving) is followed by another, a
// second later; a few cover a blip without holding the settler's loop for long.
const stopPasses = 5

// maxStopped bounds the sessions one pass lists per state: far more than a project runs.
const maxStopped = 100000

// stopScope stops every live session of the project (or of the end user): running and
// paused ones, and those admitted before the crossing that have yet to start (pending ones
// end at once, starting ones are torn down), else they would run past the cap. A session
// taking a snapshot is stopped once the snapshot is taken and it is running again. The
// sessions are listed at one instant, so that one resumed (or otherwise moved) while others
// are stopped is not missed, and up to passes passes repeat while a stop failed. Sessions
// created after createdBy (when not zero) are out of scope. It answers whether it left
// nothing live in scope: not while a wait for a snapshot runs, which may never stop its
// session (its process dies, or it times out), so that the caller holds the stop for a
// later round (which waits again if that one is gone); passes do not repeat for it, the wait
// is the one that acts.
func (e *Enforcer) stopScope(ctx context.Context, ev CapEvent, createdBy time.Time, passes int, log *slog.Logger) bool {
	for pass := 0; pass < passes; pass++ {
		if pass > 0 {
			sleep(ctx, retryAfter)
		}
		ids, err := e.Store.IDsInStates(ctx, ev.Project, liveStates, maxStopped)
		if err != nil {
			log.Error("spend cap: list sessions", "err", err)
			continue
		}
		left, awaited := 0, 0
		for _, id := range ids {
			switch e.stopOne(ctx, ev, createdBy, id, false, log) {
			case stopLeft:
				left++
			case stopAwaited:
				awaited++
			}
		}
		if left == 0 {
			return awaited == 0
		}
	}
	log.Error("spend cap: sessions left live after every pass; a later round stops them", "project", ev.Project, "end_user", ev.EndUser, "passes", passes)
	return false
}

// stopResult is what stopOne left of a session.
type stopResult int

const (
	stopDone    stopResult = iota // stopped, or out of scope
	stopLeft                      // live: its stop failed, or (inWait) it is snapshotting again
	stopAwaited                   // snapshotting: a wait stops it once its snapshot ends
)

// stopOne stops one session of the scope, retrying when its state moved under it (a pending
// session placed meanwhile is stopped as a starting one). It answers stopLeft when the
// session may be left live in scope: its stop failed, or, called by the wait for its snapshot
// (inWait), it is taking another snapshot, which that wait waits for in turn.
func (e *Enforcer) stopOne(ctx context.Context, ev CapEvent, createdBy time.Time, id string, inWait bool, log *slog.Logger) stopResult {
	for attempt := 0; attempt < 5; attempt++ {
		s, err := e.Store.Get(ctx, ev.Project, id)
		if errors.Is(err, store.ErrNotFound) {
			return stopDone
		}
		if err != nil {
			log.Error("spend cap: read session", "session", id, "err", err)
			return stopLeft
		}
		if s.State.Terminal() || s.State == session.Stopping {
			return stopDone
		}
		if ev.EndUser != "" && (s.EndUserID == nil || *s.EndUserID != ev.EndUser) {
			return stopDone
		}
		if !createdBy.IsZero() && s.CreatedAt.After(createdBy) {
			return stopDone
		}
		if s.State == session.Snapshotting {
			if inWait {
				return stopLeft
			}
			// No transition leaves snapshotting but the caller's own (back to running, or
			// failed with the host): wait for it in the background, not in the settler's loop;
			// once, however many passes (and rounds) find it snapshotting meanwhile.
			if e.startWait(ev.Project, id) {
				go func() {
					defer e.endWait(ev.Project, id)
					e.stopAfterSnapshot(context.WithoutCancel(ctx), ev, createdBy, id, log)
				}()
			}
			return stopAwaited
		}
		to, err := session.Next(s.State, session.Metering, session.SpendCap)
		if err != nil {
			return stopDone
		}
		out, err := e.Store.Transition(ctx, store.Change{Project: ev.Project, ID: id, From: s.State, To: to,
			Driver: session.Metering, Reason: session.SpendCap, Version: s.Version})
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			continue
		}
		if err != nil {
			log.Error("spend cap: stop session", "session", id, "err", err)
			return stopLeft
		}
		if to == session.Stopping && e.Stopper != nil {
			if err := e.Stopper.Stop(ctx, out); err != nil {
				log.Error("spend cap: tear down", "session", id, "err", err)
			}
		}
		return stopDone
	}
	return stopLeft
}

// startWait answers whether no wait for session id's snapshot is running, and marks one as
// running if so.
func (e *Enforcer) startWait(project, id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := project + "/" + id
	if e.waiting[k] {
		return false
	}
	if e.waiting == nil {
		e.waiting = map[string]bool{}
	}
	e.waiting[k] = true
	return true
}

// endWait marks the wait for session id's snapshot as over.
func (e *Enforcer) endWait(project, id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.waiting, project+"/"+id)
}

// snapshotWait bounds how long a spend-cap stop waits for a session's snapshot to end: far
// longer than a snapshot takes (seconds), short enough that a stuck one leaves no goroutine.
const snapshotWait = 10 * time.Minute

// stopAfterSnapshot waits until session id leaves snapshotting, then stops it as stopOne does
// (again, while that fails).
func (e *Enforcer) stopAfterSnapshot(ctx context.Context, ev CapEvent, createdBy time.Time, id string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, snapshotWait)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Error("spend cap: the session's snapshot did not end; it was not stopped", "session", id, "waited", snapshotWait)
			return
		case <-tick.C:
		}
		s, err := e.Store.Get(ctx, ev.Project, id)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return
			}
			continue // Redis away for a moment: ask again
		}
		if s.State != session.Snapshotting && e.stopOne(ctx, ev, createdBy, id, true, log) == stopDone {
			return
		}
	}
}
