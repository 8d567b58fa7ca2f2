package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"wb/desktop"
	"wb/placer"
	"wb/session"
	"wb/store"
)

// A desktop runs on the same engine as sessions: while awake it is an ordinary session of its
// project, made through the same admission path (tier DesktopTier, the desktop template, the
// size's resources, idle and lifetime timers at the tier's most, since the desktop's own idle
// time rules). Its disk is its latest disk snapshot; its sleep is a memory snapshot. Sleep =
// a disk snapshot, then the session stops, its memory saved as a snapshot on the way (the
// guest stops at its checkpoint: Guests.StopSaving); Stop = a disk snapshot, then
// the session stops; Wake = a new session restored from the memory snapshot (from the disk
// when that fails, state_saved then left out); Start = a new session restored from the disk.
// The work runs in the background (s.bg); every write of the record compares its version, so
// a request that came in between (a stop while starting, a delete) wins and the work that
// lost cleans up what it made.

// DefaultDesktopIdle is how long a desktop may go unused before it sleeps (seed 001).
const DefaultDesktopIdle = 15 * time.Minute

// DesktopTier is the tier of desktops' sessions: the longest lifetime and every size.
const DesktopTier = 4

// errDesktopMoved: the desktop left the state a piece of background work expected.
var errDesktopMoved = errors.New("the desktop moved on")

// errRecorded: a piece of background work found its own write already made (go-redis sent
// it again after its answer was lost, or the work retried it): it goes on as if it had been
// answered.
var errRecorded = errors.New("written already")

// storeAway reports whether err, from updateDesktop, is Redis failing rather than the desktop
// having moved on or gone: the work cannot tell what became of its write, so it stops and
// leaves its lease to run out, and a recovery resumes it from the record.
func storeAway(err error) bool {
	return err != nil && !errors.Is(err, errDesktopMoved) && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, errRecorded)
}

// defaultDesktopAdmitWait is how long a desktop's start waits out admission's rate and
// concurrency limits (an agent's calls waking several desktops at once) before it is refused.
const defaultDesktopAdmitWait = time.Minute

func (s *Server) desktopAdmitWait() time.Duration {
	if s.DesktopAdmitWait > 0 {
		return s.DesktopAdmitWait
	}
	return defaultDesktopAdmitWait
}

// defaultDesktopRecordFor is how long the end of a sleep or stop keeps trying to record itself
// while Redis fails (a failover takes seconds) before it leaves the work to a recovery, which
// finds its snapshots by the names the record gives them (SavingDisk, SavingState).
const defaultDesktopRecordFor = 2 * time.Minute

func (s *Server) desktopRecordFor() time.Duration {
	if s.DesktopRecordFor > 0 {
		return s.DesktopRecordFor
	}
	return defaultDesktopRecordFor
}

// resizedStateMessage is why a sleep saved no state when a resize waits.
const resizedStateMessage = "state not saved: the desktop was resized, and a saved state belongs to its old size"

func (s *Server) desktopIdle() time.Duration {
	if s.DesktopIdle > 0 {
		return s.DesktopIdle
	}
	return DefaultDesktopIdle
}

// desktopTemplate is the template of a desktop's fresh sessions: DesktopTemplate, else
// tpl_desktop when the catalog has it, else the catalog's default.
func (s *Server) desktopTemplate() string {
	if s.DesktopTemplate != "" {
		return s.DesktopTemplate
	}
	if slices.ContainsFunc(s.Catalog, func(t session.Template) bool { return t.Name == "tpl_desktop" }) {
		return "tpl_desktop"
	}
	return s.Catalog[0].Name
}

// updateDesktop reads the desktop, lets f change it (f answers errDesktopMoved, or another
// error, to give up: answered as errDesktopMoved) and writes it, again from the read when
// another write came first. Any other error is Redis's (storeAway).
func (s *Server) updateDesktop(ctx context.Context, project, id string, f func(*desktop.Record) error) (desktop.Record, error) {
	for attempt := 0; ; attempt++ {
		rec, err := s.Store.GetDesktop(ctx, project, id)
		if err != nil {
			return rec, err
		}
		next := rec
		if err := f(&next); err != nil {
			if !errors.Is(err, errDesktopMoved) {
				err = fmt.Errorf("%w: %w", errDesktopMoved, err)
			}
			return rec, err
		}
		out, err := s.Store.PutDesktop(ctx, next, rec.State)
		if errors.Is(err, store.ErrDesktopChanged) && attempt < 20 {
			continue
		}
		return out, err
	}
}

// moveDesktop makes a caller's (or an agent's) request for cause: it writes the state the
// desktop enters at once and starts the work behind it.
func (s *Server) moveDesktop(ctx context.Context, p store.Project, id string, cause desktop.Cause) (desktop.Record, error) {
	for attempt := 0; ; attempt++ {
		rec, err := s.Store.GetDesktop(ctx, p.ID, id)
		if errors.Is(err, store.ErrNotFound) {
			return rec, errNotFound("desktop", id)
		}
		if err != nil {
			return rec, err
		}
		rec = s.reconcileDesktop(ctx, p, rec)
		now, to, err := desktop.Next(rec.State, cause)
		if err != nil {
			return rec, errState("%s", err.Error())
		}
		next := rec
		next.State, next.Message, next.From = now, "", ""
		dropped := ""
		fromMemory := false
		switch now {
		case desktop.Starting:
			fromMemory = cause != desktop.Start && rec.MemorySnapshot != ""
			img := ""
			if fromMemory {
				if img, err = s.savedStateImage(ctx, p.ID, rec.MemorySnapshot); err != nil {
					return rec, err
				}
			}
			// No machine with room: 409, and the desktop stays as it is.
			if err := s.desktopRoom(ctx, rec.Size, img); err != nil {
				return rec, err
			}
			next.SessionID, next.Goal, next.From = "", "", rec.State
		case desktop.Stopping:
			next.Goal = to
		case desktop.Stopped: // asleep → stopped: the saved state is discarded
			dropped = rec.MemorySnapshot
			next.MemorySnapshot, next.StateSaved = "", false
		}
		if now == desktop.Starting || now == desktop.Stopping {
			if err := s.leaseAhead(ctx, p.ID, id); err != nil {
				return rec, err
			}
		}
		var out desktop.Record
		if cause == desktop.Idle {
			// Only if still unused: a use (a tool call beginning) records no version, and
			// one since the caller found the desktop idle must keep it awake.
			out, err = s.Store.PutDesktopIfUnused(ctx, next, rec.State, s.Now().Add(-s.desktopIdle()))
		} else {
			out, err = s.Store.PutDesktop(ctx, next, rec.State)
		}
		if errors.Is(err, store.ErrDesktopChanged) && attempt < 5 {
			continue
		}
		if errors.Is(err, store.ErrNotFound) {
			return rec, errNotFound("desktop", id)
		}
		if err != nil {
			return rec, err
		}
		switch now {
		case desktop.Starting:
			// The caller waits for admission's answer: a spend cap or a limit that refuses the
			// session is its 402 or 429, the desktop back as it was (refuseStart).
			admitted := make(chan error, 1)
			s.transitionWork(p.ID, id, func() bool { return s.startDesktop(p, out, fromMemory, admitted) })
			select {
			case err := <-admitted:
				if err != nil {
					return rec, err
				}
			case <-ctx.Done():
			}
		case desktop.Stopping:
			s.transitionWork(p.ID, id, func() bool { return s.haltDesktop(p, out) })
		case desktop.Stopped:
			if dropped != "" {
				s.dropSnapshot(ctx, p.ID, dropped)
			}
		}
		return out, nil
	}
}

// desktopRoom answers a 409 when no live node could take a session of size now. With img, the
// root disk image a wake's saved state needs (savedStateImage), only the nodes that have it
// count, as the placer places the wake only there; when no live node has it at all, any
// counts: the wake is then from the disk (its create is refused on restore_from).
func (s *Server) desktopRoom(ctx context.Context, size desktop.Size, img string) error {
	if _, err := s.guests(); err != nil {
		return err
	}
	nodes, err := s.Store.Nodes(ctx)
	if err != nil {
		return err
	}
	res := size.Resources()
	now := s.Now()
	roomy, imaged, roomyImaged := false, false, false
	for _, n := range nodes {
		// Live by the placer's rule and timeout (NodeTimeout): a node it would not place on is
		// no room, and one it would is.
		if !placer.CanHost(n, s.Regions[0], DesktopTier, "", now, s.NodeTimeout) {
			continue
		}
		room := n.VCPU-n.UsedVCPU >= res.VCPU && n.MemoryMiB-n.UsedMemoryMiB >= res.MemoryMiB
		has := img == "" || slices.Contains(n.Images, img)
		roomy, imaged, roomyImaged = roomy || room, imaged || has, roomyImaged || room && has
	}
	if roomyImaged || roomy && !imaged {
		return nil
	}
	msg := fmt.Sprintf("no machine has room for a desktop of size %s (%d vCPU, %d MiB) now", size, res.VCPU, res.MemoryMiB)
	if roomy {
		msg = fmt.Sprintf("no machine that can restore the desktop's saved state (those with the root disk image it ran on) "+
			"has room for a desktop of size %s (%d vCPU, %d MiB) now", size, res.VCPU, res.MemoryMiB)
	}
	advice := "; the desktop stays as it is: try again later, or resize it"
	if img != "" {
		// A resize of an asleep desktop gives its saved state up (seed 001): the advice says so.
		advice = "; the desktop stays asleep with its saved state: try again later (resizing it lets it start on any machine with room, but gives the saved state up)"
	}
	return &apiError{Status: 409, Type: "invalid_state", Code: "no_capacity", Message: msg + advice}
}

// savedStateImage answers the root disk image the desktop's saved state (memory snapshot id)
// needs, "" when any node can restore it (a snapshot that names none, or one gone, whose
// wake's create is refused and the desktop woken from the disk).
func (s *Server) savedStateImage(ctx context.Context, project, id string) (string, error) {
	var snap session.SnapshotRecord
	err := s.Store.GetObject(ctx, project, store.KindSnapshot, id, &snap)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil || !snap.IncludeMemory {
		return "", err
	}
	return snap.RootImage, nil
}

// startDesktop makes the session of a desktop in starting: restored from its memory snapshot
// (fromMemory), else from its disk snapshot, else fresh from the template; then it runs the
// desktop's setup after a start that was not a memory restore, and marks the desktop running.
// It answers false when it stopped for want of Redis (transitionWork), true when the work is
// done, whatever its outcome. admitted (nil: nobody waits) hears once how admission went: nil,
// or the refusal refuseStart answers.
func (s *Server) startDesktop(p store.Project, rec desktop.Record, fromMemory bool, admitted chan<- error) bool {
	ctx := s.ctx
	defer tell(admitted, nil)
	restore := rec.DiskSnapshot
	if fromMemory {
		restore = rec.MemorySnapshot
	}
	tier := DesktopTier
	t, _ := s.Tiers.Tier(tier)
	idle, life := session.IdleTimeoutMaxS, min(t.MaxLifetimeS, session.LifetimeMaxS)
	size, _ := rec.StartSize()
	req := session.CreateRequest{Tier: &tier, Resources: &session.ResourceRequest{SizeClass: string(size)},
		IdleTimeoutS: &idle, MaxLifetimeS: &life, RestoreFrom: restore}
	if restore == "" {
		req.Template = s.desktopTemplate()
	}
	// The session's id is recorded before the session exists, so that a stop or delete from
	// now on tears it down, and a gateway that takes this work over (desktop_recovery.go)
	// finds it rather than making a second.
	sessID := rec.SessionID
	if sessID == "" {
		sessID = session.NewID("sess_", s.Now())
		_, err := s.updateDesktop(ctx, p.ID, rec.ID, func(r *desktop.Record) error {
			if r.State == desktop.Starting && r.SessionID == sessID {
				return errRecorded
			}
			if r.State != desktop.Starting || r.SessionID != "" {
				return errDesktopMoved
			}
			r.SessionID = sessID
			return nil
		})
		if err != nil && !errors.Is(err, errRecorded) {
			return !storeAway(err)
		}
	}
	if _, err := s.Store.Get(ctx, p.ID, sessID); errors.Is(err, store.ErrNotFound) {
		// The mark makes each of the desktop's sessions known as its own, also to the usage
		// report (quota's settler labels their usage with it): its cost is their sum.
		marks := map[string]string{session.DesktopMetadataKey: rec.ID}
		if err := s.admitDesktopSession(ctx, p, req, sessID, marks); err != nil {
			refusal := toAPIError(err)
			switch _, got := s.Store.Get(ctx, p.ID, sessID); {
			case got == nil:
				// Written after all, its answer lost: the session is this work's.
			case !errors.Is(got, store.ErrNotFound) || refusal.Code == "store_unavailable":
				s.log.Warn("desktop: its session could not be made for want of Redis; the start is resumed when its lease runs out",
					"desktop", rec.ID, "err", err)
				return false
			case fromMemory && refusal.Param == "restore_from":
				// The saved state's snapshot is gone (the caller deleted it) or not ready, or no
				// live node has the root disk image its memory needs (checkRestorable).
				s.log.Warn("desktop: the saved state cannot be restored; waking from the disk", "desktop", rec.ID, "why", refusal.Message)
				return s.wakeFromDisk(p, rec.ID, sessID, restore, refusal.Message, admitted)
			case refusal.Status == 402 || refusal.Status == 429:
				return s.refuseStart(ctx, p, rec, sessID, refusal, admitted)
			default:
				return s.failDesktop(ctx, p, rec.ID, sessID, "the desktop's session could not be made: "+refusal.Message)
			}
		}
		// A stop or delete that came while it was admitted may have looked for the session
		// before it existed: the session is this work's to end.
		cur, err := s.Store.GetDesktop(ctx, p.ID, rec.ID)
		if storeAway(err) {
			return false // the session stays, and the recovery finds it
		}
		if err != nil || cur.State != desktop.Starting || cur.SessionID != sessID {
			s.stopSession(ctx, p, sessID)
			return true
		}
	} else if err != nil {
		return false // Redis is away: the lease runs out and the work is resumed
	}
	tell(admitted, nil) // admitted: the caller answers now, the start goes on
	got, err := s.awaitSession(ctx, p, sessID, t.ProvisionDeadline()+time.Minute, func(st session.State) bool {
		return st == session.Running || st.Terminal()
	})
	if err != nil || got.State != session.Running {
		why := "it did not run in time"
		if err == nil && got.StateReason != nil {
			why = string(*got.StateReason)
		}
		s.stopSession(ctx, p, sessID)
		if fromMemory && err == nil && got.State == session.Failed && got.NodeID == "" && why == string(session.ProvisionTimeout) {
			// Never placed: no node that can restore the saved state had room for it in time
			// (the room check saw some, but the project's share of it, or a placement since,
			// took it). The state was never tried, so it is kept, and the desktop goes back to
			// sleep, as when no machine has room (seed 001).
			s.log.Warn("desktop: no node that can restore the saved state had room in time; back to sleep with it", "desktop", rec.ID)
			return s.refuseStart(ctx, p, rec, sessID, &apiError{Status: 409, Type: "invalid_state", Code: "no_capacity",
				Message: "no machine that can restore the desktop's saved state had room for it before its start's deadline; " +
					"the saved state is kept: wake it again later, or stop and start it to start fresh without the saved state"}, nil)
		}
		if fromMemory {
			s.log.Warn("desktop: the saved state could not be restored; waking from the disk", "desktop", rec.ID, "why", why)
			return s.wakeFromDisk(p, rec.ID, sessID, restore, why, nil)
		}
		return s.failDesktop(ctx, p, rec.ID, sessID, "the desktop could not start: "+why)
	}
	if !fromMemory && s.DesktopSetup != nil {
		setupCtx, cancel := context.WithTimeout(ctx, desktopSetupWait)
		err := s.DesktopSetup(setupCtx, sessionExecer{s: s, sess: got})
		cancel()
		if err != nil {
			s.log.Warn("desktop: setup failed", "desktop", rec.ID, "session", sessID, "err", err)
			s.stopSession(ctx, p, sessID)
			return s.failDesktop(ctx, p, rec.ID, sessID, "the desktop could not start its display and browser: "+redactInternal(err.Error()))
		}
	}
	// The use is recorded before the desktop is written running, so that no reader (nor
	// desktop.running's event, which carries the record) sees it running with no last use.
	now := s.Now()
	if _, err := s.Store.TouchDesktop(ctx, p.ID, rec.ID, now); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("desktop: mark used", "desktop", rec.ID, "err", err) // deleted meanwhile: below
	}
	_, err = s.updateDesktop(ctx, p.ID, rec.ID, func(r *desktop.Record) error {
		if r.State == desktop.Running && r.SessionID == sessID {
			return errRecorded
		}
		if r.State != desktop.Starting || r.SessionID != sessID {
			return errDesktopMoved
		}
		r.State, r.From = desktop.Running, ""
		return nil
	})
	switch {
	case errors.Is(err, errRecorded):
	case errors.Is(err, store.ErrNotFound):
		s.stopSession(ctx, p, sessID) // deleted while it started
		return true
	case storeAway(err):
		return false
	case err != nil:
		return true // a stop came first: it owns the session now
	}
	if err := s.setIdleDeadline(ctx, p.ID, rec.ID, now); err != nil {
		s.log.Warn("desktop: idle deadline", "desktop", rec.ID, "err", err)
	}
	return true
}

// desktopSetupWait bounds a desktop's setup (DesktopSetup): its exec lasts no longer, so a
// start whose setup hangs (a probe in the guest that never returns) fails the desktop with a
// timeout, rather than keep it starting for an exec's ten minutes while its callers wait.
// desktop/guest's start gives up on its own after 90 s.
const desktopSetupWait = 2 * time.Minute

// admitDesktopSession admits a desktop's session under id, waiting out admission's rate and
// concurrency limits for up to desktopAdmitWait.
func (s *Server) admitDesktopSession(ctx context.Context, p store.Project, req session.CreateRequest, id string, marks map[string]string) error {
	deadline := time.Now().Add(s.desktopAdmitWait())
	for {
		_, _, err := s.admitRequest(ctx, p, req, id, marks)
		if err == nil {
			return nil
		}
		refusal := toAPIError(err)
		if refusal.Status != 429 || refusal.RetryAfter <= 0 || time.Now().Add(refusal.RetryAfter).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(refusal.RetryAfter):
		}
	}
}

// wakeFromDisk gives up a wake's saved state (snapshot), which could not be restored (why),
// and starts the desktop from its disk instead: seed 001's "a snapshot that cannot be restored
// is given up the same way" as one that could not be taken.
func (s *Server) wakeFromDisk(p store.Project, id, sessID, snapshot, why string, admitted chan<- error) bool {
	message := "state not saved: the saved state could not be restored (" + why + ")"
	next, err := s.updateDesktop(s.ctx, p.ID, id, func(r *desktop.Record) error {
		if r.State == desktop.Starting && r.SessionID == "" && r.Message == message {
			return errRecorded
		}
		if r.State != desktop.Starting || r.SessionID != sessID {
			return errDesktopMoved
		}
		r.SessionID, r.MemorySnapshot, r.StateSaved, r.Message = "", "", false, message
		return nil
	})
	if err != nil && !errors.Is(err, errRecorded) {
		return !storeAway(err)
	}
	s.dropSnapshot(s.ctx, p.ID, snapshot)
	return s.startDesktop(p, next, false, admitted)
}

// tell sends err on admitted if nobody was told yet (admitted holds one answer) and someone
// waits (admitted not nil).
func tell(admitted chan<- error, err error) {
	select {
	case admitted <- err:
	default:
	}
}

// refuseStart puts a desktop whose session admission refused for the project's spend cap or
// limits (402, or 429 past desktopAdmitWait) back where it came from (rec.From: asleep, its
// saved state kept; stopped; failed), and tells admitted the refusal, which the wake, start or
// agent's call answers. Seed 001 leaves a desktop as it is when no machine has room for it,
// with a 409; it says nothing of caps and limits, which are no more the desktop's doing, and
// failing it lost its saved state. A create's start has nowhere to go back to: it fails.
func (s *Server) refuseStart(ctx context.Context, p store.Project, rec desktop.Record, sessID string, refusal *apiError, admitted chan<- error) bool {
	back := rec.From
	if back == "" {
		return s.failDesktop(ctx, p, rec.ID, sessID, "the desktop's session could not be made: "+refusal.Message)
	}
	what := "start"
	if back == desktop.Asleep {
		what = "wake"
	}
	message := "the last " + what + " was refused: " + refusal.Message
	out, err := s.updateDesktop(ctx, p.ID, rec.ID, func(r *desktop.Record) error {
		if r.State == back && r.SessionID == "" && r.Message == message {
			return errRecorded
		}
		if r.State != desktop.Starting || r.SessionID != sessID {
			return errDesktopMoved
		}
		r.State, r.SessionID, r.From, r.Message = back, "", "", message
		return nil
	})
	if storeAway(err) {
		return false
	}
	if err != nil && !errors.Is(err, errRecorded) {
		return true // a stop or delete came first
	}
	kept := ""
	if back == desktop.Asleep && out.MemorySnapshot != "" {
		kept = ", its saved state kept"
	}
	tell(admitted, &apiError{Status: refusal.Status, Type: refusal.Type, Code: refusal.Code, Param: refusal.Param, RetryAfter: refusal.RetryAfter,
		Message: fmt.Sprintf("desktop %s was not %s and stays %s%s: %s", rec.ID, map[string]string{"wake": "woken", "start": "started"}[what], back, kept, refusal.Message)})
	return true
}

// failDesktop moves a desktop in starting (with session sessionID, "" for none yet) to
// failed with message; a saved state it had goes (a start from failed is a fresh one). It
// answers false when Redis failed it (transitionWork).
func (s *Server) failDesktop(ctx context.Context, p store.Project, id, sessionID, message string) bool {
	saved := ""
	_, err := s.updateDesktop(ctx, p.ID, id, func(r *desktop.Record) error {
		if r.State == desktop.Failed && r.Message == message {
			return errRecorded
		}
		if r.State != desktop.Starting || r.SessionID != sessionID {
			return errDesktopMoved
		}
		if _, _, err := desktop.Next(r.State, desktop.StartFailed); err != nil {
			return err
		}
		saved = r.MemorySnapshot
		r.State, r.Message, r.SessionID, r.From = desktop.Failed, message, "", ""
		r.MemorySnapshot, r.StateSaved = "", false
		return nil
	})
	if storeAway(err) {
		s.log.Error("desktop: record a failed start", "desktop", id, "err", err)
		return false
	}
	if (err == nil || errors.Is(err, errRecorded)) && saved != "" {
		s.dropSnapshot(ctx, p.ID, saved)
	}
	return true
}

// haltDesktop does the work of a desktop in stopping: the disk snapshot; for a sleep, the
// memory snapshot as the session stops (none when a resize waits: the state belongs to the
// old size); the session stops, and the desktop is asleep or stopped. It answers false when
// Redis failed the record of its end (transitionWork), true when the work is done.
func (s *Server) haltDesktop(p store.Project, rec desktop.Record) bool {
	ctx := s.ctx
	sessID := rec.SessionID
	var sess *session.Session
	if sessID != "" {
		t, _ := s.Tiers.Tier(DesktopTier)
		got, err := s.awaitSession(ctx, p, sessID, t.ProvisionDeadline()+time.Minute, func(st session.State) bool {
			return st == session.Running || st.Terminal()
		})
		if err == nil {
			sess = got
		}
	}
	disk, mem, saved, why := "", "", false, ""
	named := rec.SavingDisk // the halt whose snapshots the record names: this one, or it was superseded
	if sess != nil && sess.State == session.Running {
		diskID, memID := session.NewID("snap_", s.Now()), ""
		named = diskID
		if rec.Goal == desktop.Asleep {
			memID = session.NewID("snap_", s.Now())
		}
		if !s.nameSaving(ctx, p, rec, diskID, memID) {
			return false
		}
		snap, err := s.takeSnapshotAs(ctx, sess, diskID, false)
		if err != nil {
			why = "the disk could not be saved; it is as it was at the last sleep or stop (" + toAPIError(err).Message + ")"
			s.log.Warn("desktop: disk snapshot", "desktop", rec.ID, "err", err)
		} else {
			disk = snap.ID
		}
		if rec.Goal == desktop.Asleep {
			mem, saved, why = s.saveStateAndStop(ctx, p, rec, sess.ID, memID, why)
		}
	} else if rec.SavingDisk != "" || rec.SavingState != "" {
		// A halt before this one took its snapshots and stopped the session, but could not
		// record its end (its gateway died, or Redis was away longer than it tried): they are
		// the desktop's, its disk and its saved state as they were when it stopped.
		var err error
		if disk, mem, saved, why, err = s.savedBy(ctx, p.ID, rec); err != nil {
			s.log.Warn("desktop: read the snapshots of a sleep or stop; it is resumed when its lease runs out", "desktop", rec.ID, "err", err)
			return false
		}
	} else if sess != nil {
		why = "state not saved: the desktop's session had ended"
	}
	if sessID != "" {
		s.stopSession(ctx, p, sessID)
		_, _ = s.awaitSession(ctx, p, sessID, 2*time.Minute, func(st session.State) bool { return st.Terminal() })
	}
	// The snapshots replaced go once the new ones are recorded: the old disk, and the saved
	// state this session was woken from. A state saved at the old size, when a resize came
	// during the sleep, is not kept either.
	var oldDisk, oldMem, unkept string
	record := func() error {
		_, err := s.updateDesktop(ctx, p.ID, rec.ID, func(r *desktop.Record) error {
			kept := mem
			if unkept != "" {
				kept = ""
			}
			if r.State == rec.Goal && r.SessionID == "" && (disk == "" || r.DiskSnapshot == disk) && r.MemorySnapshot == kept {
				return errRecorded // this work's own write, its answer lost
			}
			// A newer halt names its own snapshots; none named is an older gateway's write
			// during a rolling deploy (it drops the fields it does not know), not a newer halt.
			if r.State != desktop.Stopping || r.SessionID != sessID || r.SavingDisk != named && r.SavingDisk != "" {
				return errDesktopMoved
			}
			if err := desktop.Halt(r.State, r.Goal); err != nil {
				return err
			}
			oldDisk, oldMem, unkept = r.DiskSnapshot, r.MemorySnapshot, ""
			if disk != "" {
				r.DiskSnapshot = disk
			}
			r.State, r.Goal, r.SessionID = r.Goal, "", ""
			r.MemorySnapshot, r.StateSaved, r.Message = mem, saved, why
			r.SavingDisk, r.SavingState = "", ""
			if _, resized := r.StartSize(); resized && mem != "" {
				r.MemorySnapshot, r.StateSaved, r.Message, unkept = "", false, resizedStateMessage, mem
			}
			if r.NextSize != "" { // the resize that waited: asleep or stopped, it has it now
				r.Size, r.NextSize = r.NextSize, ""
			}
			return nil
		})
		return err
	}
	err := record()
	for wait, until := 250*time.Millisecond, time.Now().Add(s.desktopRecordFor()); storeAway(err) && time.Now().Before(until); wait = min(2*wait, 5*time.Second) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		err = record()
	}
	switch {
	case storeAway(err):
		// Its snapshots stay, named in the record (nameSaving): the recovery ends the sleep
		// or stop with them.
		s.log.Error("desktop: record the end of a sleep or stop; it is resumed when its lease runs out",
			"desktop", rec.ID, "disk_snapshot", disk, "memory_snapshot", mem, "err", err)
		return false
	case err != nil && !errors.Is(err, errRecorded):
		// Deleted or moved on meanwhile: nothing keeps them, unless the record names them
		// after all (a write of this work's that landed, the desktop moved on since).
		cur, gerr := s.Store.GetDesktop(ctx, p.ID, rec.ID)
		for _, id := range []string{disk, mem} {
			if id != "" && (gerr != nil && errors.Is(gerr, store.ErrNotFound) || gerr == nil && cur.DiskSnapshot != id && cur.MemorySnapshot != id) {
				s.dropSnapshot(ctx, p.ID, id)
			}
		}
		return true
	}
	if disk != "" && oldDisk != "" && oldDisk != disk {
		s.dropSnapshot(ctx, p.ID, oldDisk)
	}
	if oldMem != "" && oldMem != mem {
		s.dropSnapshot(ctx, p.ID, oldMem)
	}
	if unkept != "" {
		s.dropSnapshot(ctx, p.ID, unkept)
	}
	// The idle deadline is not forgotten here: a wake may have set its own since the record
	// said asleep, and the idle loop forgets a deadline that finds the desktop asleep.
	return true
}

// nameSaving records in the stopping desktop's record the snapshots its halt is about to
// take (diskID, and memID for a sleep; SavingDisk, SavingState), so that a recovery of the
// halt finds them; those a dead halt of the same session named before go, superseded. It
// answers false when Redis failed the write (nothing is taken yet: a recovery resumes the
// halt). A desktop that moved on meanwhile is halted as before, the snapshots dropped at its
// end.
func (s *Server) nameSaving(ctx context.Context, p store.Project, rec desktop.Record, diskID, memID string) bool {
	var superseded []string
	_, err := s.updateDesktop(ctx, p.ID, rec.ID, func(r *desktop.Record) error {
		if r.State == desktop.Stopping && r.SessionID == rec.SessionID && r.SavingDisk == diskID {
			return errRecorded
		}
		if r.State != desktop.Stopping || r.SessionID != rec.SessionID {
			return errDesktopMoved
		}
		superseded = []string{r.SavingDisk, r.SavingState}
		r.SavingDisk, r.SavingState = diskID, memID
		return nil
	})
	if storeAway(err) {
		s.log.Warn("desktop: name the snapshots of a sleep or stop; it is resumed when its lease runs out", "desktop", rec.ID, "err", err)
		return false
	}
	if err == nil {
		for _, id := range superseded {
			if id != "" {
				s.dropSnapshot(ctx, p.ID, id)
			}
		}
	}
	return true
}

// savedBy answers what the earlier halt named in rec took (haltDesktop's disk, memory
// snapshot, whether the state was saved and the message): the snapshots of those names that
// were recorded ready. An error is Redis's: the halt cannot tell what it has.
func (s *Server) savedBy(ctx context.Context, project string, rec desktop.Record) (string, string, bool, string, error) {
	var failed error
	ready := func(id string, memory bool) bool {
		var snap session.Snapshot
		if id == "" {
			return false
		}
		if err := s.Store.GetObject(ctx, project, store.KindSnapshot, id, &snap); err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				failed = err
			}
			return false
		}
		return snap.State == session.SnapshotReady && snap.IncludeMemory == memory
	}
	disk, mem, why := "", "", ""
	if ready(rec.SavingDisk, false) {
		disk = rec.SavingDisk
	} else {
		why = "the disk could not be saved; it is as it was at the last sleep or stop"
	}
	if rec.Goal != desktop.Asleep {
		return disk, "", false, why, failed
	}
	if ready(rec.SavingState, true) {
		mem = rec.SavingState // a resize since: the record's write drops it, saying so
	} else if _, resized := rec.StartSize(); resized {
		why = resizedStateMessage
	} else if why == "" {
		why = "state not saved: the desktop's session had ended before its state was saved"
	}
	return disk, mem, mem != "", why, failed
}

// saveStateAndStop stops a sleeping desktop's session, its guest saved first, memory and
// all, as a snapshot (Guests.StopSaving: the guest stops at its checkpoint, where a memory
// snapshot of a running session would restore it only for the stop to tear it down). It
// answers the snapshot, whether the state was saved, and the message to show when not. Where
// it did not move the session to stopping, haltDesktop's stop ends it as any other.
func (s *Server) saveStateAndStop(ctx context.Context, p store.Project, rec desktop.Record, sessionID, snapID, why string) (string, bool, string) {
	if _, fresh := rec.StartSize(); fresh {
		return "", false, resizedStateMessage
	}
	g, err := s.guests()
	if err != nil {
		return "", false, "state not saved: " + toAPIError(err).Message
	}
	sess, err := s.Store.Get(ctx, p.ID, sessionID) // the disk snapshot moved its version on
	if err != nil || sess.State != session.Running {
		return "", false, "state not saved: the desktop's session had ended"
	}
	proj, err := s.snapshotRoom(ctx, p.ID)
	if err != nil {
		return "", false, "state not saved: " + toAPIError(err).Message
	}
	stopping, err := s.Store.Transition(ctx, store.Change{Project: p.ID, ID: sess.ID, From: session.Running, To: session.Stopping,
		Driver: session.Caller, Reason: session.Deleted, Version: sess.Version})
	if err != nil {
		return "", false, "state not saved: " + toAPIError(err).Message
	}
	s.forgetSessions(p.ID)
	bg := context.WithoutCancel(ctx)
	snap := session.Snapshot{ID: snapID, Object: "snapshot", SessionID: sess.ID, IncludeMemory: true,
		State: session.SnapshotReady, CreatedAt: *session.At(s.Now()), Template: sess.Template, Tier: sess.Tier, NodeID: sess.NodeID}
	// Under a snapshot lease, as any snapshot: should this gateway die before the snapshot is
	// recorded, the recovery records it failed, so that its files are not lost to sight.
	endLease := s.holdSnapshotLease(bg, store.SessionRef{Project: p.ID, ID: sess.ID}, snap.ID)
	defer endLease(false)
	// notSaved gives up the snapshot: whatever the node wrote of it goes, and the lease with it.
	notSaved := func(why string) (string, bool, string) {
		s.dropSnapshot(bg, p.ID, snap.ID) // a recovery may have recorded it failed meanwhile
		endLease(true)
		return "", false, "state not saved: " + why
	}
	info, err := g.StopSaving(bg, stopping, snap.ID)
	if err != nil {
		s.log.Warn("desktop: save the state as the session stops", "desktop", rec.ID, "err", err)
		s.teardown(stopping) // the node may not have heard of the stop at all
		return notSaved(s.errNode(ctx, "snapshot_failed", "the node could not save the desktop's state", err).Message)
	}
	if !info.Memory {
		return notSaved("this machine's guests cannot save their memory")
	}
	snap.SizeBytes = info.SizeBytes
	// The root disk image its memory needs, as a session's snapshot records it: the wake's
	// restore is placed on a node that has it (or refused at its create, woken from the disk).
	if err := s.recordSnapshot(bg, proj, session.SnapshotRecord{Snapshot: snap, RootImage: info.RootImage}); err != nil {
		s.log.Warn("desktop: record the saved state", "desktop", rec.ID, "err", err)
		return notSaved(toAPIError(err).Message)
	}
	endLease(true)
	if _, err := s.Store.AppendEvent(bg, p.ID, session.EventSnapshotReady, sess.ID, snap); err != nil {
		s.log.Warn("desktop: the saved state's event", "desktop", rec.ID, "err", err)
	}
	return snap.ID, true, why
}

// removeDesktop tears down what a deleted desktop left: its session and snapshots.
func (s *Server) removeDesktop(p store.Project, rec desktop.Record) {
	ctx := s.ctx
	if rec.SessionID != "" {
		s.stopSession(ctx, p, rec.SessionID)
	}
	for _, id := range []string{rec.DiskSnapshot, rec.MemorySnapshot, rec.SavingDisk, rec.SavingState} {
		if id != "" {
			s.dropSnapshot(ctx, p.ID, id)
		}
	}
}

// reconcileDesktop moves a running desktop whose session ended under it (its host failed,
// its guest crashed, its lifetime ran out) to stopped: what is left is its disk.
func (s *Server) reconcileDesktop(ctx context.Context, p store.Project, rec desktop.Record) desktop.Record {
	if rec.State != desktop.Running || rec.SessionID == "" {
		return rec
	}
	sess, err := s.Store.Get(ctx, p.ID, rec.SessionID)
	if err == nil && !sess.State.Terminal() {
		return rec
	}
	why := "its session is gone"
	if err == nil && sess.StateReason != nil {
		why = "its session ended: " + string(*sess.StateReason)
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return rec
	}
	saved := ""
	out, err := s.updateDesktop(ctx, p.ID, rec.ID, func(r *desktop.Record) error {
		if r.State != desktop.Running || r.SessionID != rec.SessionID {
			return errDesktopMoved
		}
		to, _, err := desktop.Next(r.State, desktop.SessionEnded)
		if err != nil {
			return err
		}
		saved = r.MemorySnapshot // the state it was woken from: stopped keeps none
		r.State, r.SessionID, r.Message = to, "", "stopped: "+why+"; it starts fresh from its disk"
		r.MemorySnapshot, r.StateSaved = "", false
		return nil
	})
	if err != nil {
		return rec
	}
	if saved != "" {
		s.dropSnapshot(ctx, p.ID, saved)
	}
	return out
}

// stopSession asks for the session's end (a caller's delete), logging what fails.
func (s *Server) stopSession(ctx context.Context, p store.Project, id string) {
	for attempt := 0; attempt < 60; attempt++ {
		_, _, err := s.stop(ctx, p, id)
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == 409 { // snapshotting: wait for it to end
			select {
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		if err != nil && !errors.As(err, &ae) {
			s.log.Warn("desktop: stop its session", "session", id, "err", err)
		}
		return
	}
}

// awaitSession polls the session until done accepts its state, or until timeout, with the
// desktop wait's backoff (a wake waits on it).
func (s *Server) awaitSession(ctx context.Context, p store.Project, id string, timeout time.Duration, done func(session.State) bool) (*session.Session, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for pause := desktopWaitFirst; ; pause = min(2*pause, desktopWaitMost) {
		sess, err := s.Store.Get(ctx, p.ID, id)
		if err == nil && done(sess.State) {
			return sess, nil
		}
		if errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return sess, fmt.Errorf("session %s: %w", id, ctx.Err())
		case <-time.After(pause):
		}
	}
}

// dropSnapshot deletes a snapshot's object and its files on the node.
func (s *Server) dropSnapshot(ctx context.Context, project, id string) {
	if err := s.Store.DeleteObject(ctx, project, store.KindSnapshot, id); err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("desktop: delete snapshot", "snapshot", id, "err", err)
	}
	s.deleteSnapshotFiles(ctx, id)
}

// deleteSnapshotFiles deletes a snapshot's files on the nodes, logging what fails.
func (s *Server) deleteSnapshotFiles(ctx context.Context, id string) {
	if d, ok := s.Guests.(interface {
		DeleteSnapshot(ctx context.Context, id string) error
	}); ok {
		if err := d.DeleteSnapshot(ctx, id); err != nil {
			s.log.Warn("desktop: delete snapshot files", "snapshot", id, "err", err)
		}
	}
}

// sessionExecer runs commands in a desktop's session for its setup (and for the screen and
// the MCP tools, which count themselves among the project's calls). It takes no exec slot of
// the project (Config.MaxConcurrentExecs): a setup is the gateway's own work, one per desktop
// start and bounded by desktopSetupWait, and a project's execs filling its slots must not
// fail its desktops' starts (a refused setup fails the desktop).
type sessionExecer struct {
	s    *Server
	sess *session.Session
}

func (e sessionExecer) Exec(ctx context.Context, argv []string, stdin []byte) ([]byte, []byte, int, error) {
	cmd, err := json.Marshal(argv)
	if err != nil {
		return nil, nil, 0, err
	}
	// The exec lasts as long as ctx allows (a desktop's display and browser take longer to
	// start than an exec's default minute), up to the longest exec; without a deadline, ten
	// minutes.
	timeout := 600
	if d, ok := ctx.Deadline(); ok {
		timeout = min(max(1, int(time.Until(d)/time.Second)), session.ExecTimeoutMaxS)
	}
	res, err := e.s.runExec(ctx, e.sess, session.ExecRequest{Command: cmd, Stdin: string(stdin), TimeoutS: &timeout}, nil)
	if err != nil {
		return nil, nil, 0, err
	}
	if res.TimedOut {
		return []byte(res.Stdout), []byte(res.Stderr), res.ExitCode, &execTimedOut{name: argv[0], timeoutS: timeout}
	}
	return []byte(res.Stdout), []byte(res.Stderr), res.ExitCode, nil
}

// execTimedOut is the error of a sessionExecer's command that ran past its timeout.
type execTimedOut struct {
	name     string
	timeoutS int
}

func (e *execTimedOut) Error() string {
	return fmt.Sprintf("%s did not finish within %ds", e.name, e.timeoutS)
}
