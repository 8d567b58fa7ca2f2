package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"wb/desktop"
	"wb/session"
	"wb/store"
)

// A call that needs the desktop's guest (an MCP tool call, a file sent, read or deleted)
// first waits for the desktop to run, waking it when its cause may (seed 001, "What an MCP
// call does"). The store has no change feed for desktops, so the wait reads the record with
// a short backoff: a read is one Redis hash fetch, and a wake takes seconds.

// Bounds of the backoff between reads of the desktop (or of its session, awaitSession): a
// read is one Redis round trip, and a wait adds up to desktopWaitMost to what it waits for
// (the session's fixed 100 ms poll added about 80 ms to a sleep of 0.3 s).
const (
	desktopWaitFirst = 10 * time.Millisecond
	desktopWaitMost  = 50 * time.Millisecond
)

// desktopWakeWait bounds how long a call waits for a desktop to run: its session's
// provisioning deadline and the minute startDesktop adds to it, twice (a wake whose saved
// state is not restored by then starts again from the disk: wakeFromDisk), plus its display
// and browser's start (desktopSetupWait), with room to spare: a start that fails within them
// answers the call with the failure, not a timeout.
func (s *Server) desktopWakeWait() time.Duration {
	t, _ := s.Tiers.Tier(DesktopTier)
	return 2*(t.ProvisionDeadline()+time.Minute) + desktopSetupWait + time.Minute
}

// useDesktop is awakeDesktop for a call that uses the desktop (cause desktop.MCP or
// desktop.File; "" is a read, no use, and records nothing): the use is recorded as the call
// begins, and counts only if the desktop was awake when it was. The idle loop may put the
// desktop to sleep between awakeDesktop's look and that record: a use recorded first keeps it
// awake (the sleep's move refuses, store.DesktopUsedError), but one recorded after finds it
// asleep or going to sleep, and the call would run on a session that is stopping (a loaded
// cold run saw a command cut off with EOF). The call then waits for the sleep and wakes the
// desktop, as any call to a desktop going to sleep does. A use that cannot be recorded
// (Redis failing) does not hold the call back.
func (s *Server) useDesktop(ctx context.Context, p store.Project, id string, cause desktop.Cause) (*session.Session, error) {
	const most = 3 // looks at a desktop that falls asleep each time: its idle time is minutes
	for tries := 1; ; tries++ {
		_, sess, err := s.awakeDesktop(ctx, p, id, cause)
		if err != nil || cause == "" {
			return sess, err
		}
		awake, err := s.recordDesktopUse(ctx, p.ID, id)
		var ae *apiError
		if errors.As(err, &ae) {
			return nil, err // deleted meanwhile: its 404
		}
		if err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "desktop: record a use", "desktop", id, "err", err)
		}
		if awake || err != nil {
			return sess, nil
		}
		if tries == most {
			return nil, errState("desktop %s fell asleep as the call began, %d times; try the call again", id, most)
		}
	}
}

// awakeDesktop answers desktop id of project p running, with its running session, for a
// call caused by cause. Running: at once. Starting: once it runs. Asleep: cause desktop.MCP
// or desktop.File wakes it (moveDesktop: no machine with room is its 409) and it waits; cause
// "" (a read, which is no use) answers 409. Stopping: it waits for a sleep to end and then
// wakes it; a stop answers 409 at once. Stopped: 409, start it first. Failed: 502 with its
// message. The wait ends with ctx, or after desktopWakeWait with a 504.
func (s *Server) awakeDesktop(ctx context.Context, p store.Project, id string, cause desktop.Cause) (desktop.Record, *session.Session, error) {
	waitCtx, cancel := context.WithTimeout(ctx, s.desktopWakeWait())
	defer cancel()
	var rec desktop.Record
	orphan := true // looked for once a wait is long enough: its desktop has a lease, or gets one
	for pause := desktopWaitFirst; ; pause = min(2*pause, desktopWaitMost) {
		var err error
		rec, err = s.Store.GetDesktop(waitCtx, p.ID, id)
		if errors.Is(err, store.ErrNotFound) {
			return rec, nil, errNotFound("desktop", id)
		}
		if err != nil && waitCtx.Err() == nil {
			return rec, nil, err
		}
		if err == nil {
			rec = s.reconcileDesktop(waitCtx, p, rec)
			if orphan && s.leaseOrphan(waitCtx, rec) {
				orphan = false
			}
			sess, err := s.desktopReady(waitCtx, p, rec, cause)
			if sess != nil || err != nil {
				return rec, sess, err
			}
		}
		select {
		case <-waitCtx.Done():
			if ctx.Err() != nil {
				return rec, nil, ctx.Err()
			}
			return rec, nil, &apiError{Status: 504, Type: "api_error", Code: "wake_timeout", Message: fmt.Sprintf(
				"desktop %s did not run within %s (it is %s); try the call again", id, s.desktopWakeWait(), rec.State)}
		case <-time.After(pause):
		}
	}
}

// desktopReady is one look at rec for awakeDesktop: its running session, an error that ends
// the wait, or neither (wait and look again). An asleep desktop it wakes for cause.
func (s *Server) desktopReady(ctx context.Context, p store.Project, rec desktop.Record, cause desktop.Cause) (*session.Session, error) {
	switch rec.State {
	case desktop.Running:
		sess, err := s.Store.Get(ctx, p.ID, rec.SessionID)
		if err == nil && sess.State == session.Running {
			return sess, nil
		}
		return nil, nil // an ended session: the next look's reconcileDesktop stops the desktop
	case desktop.Asleep:
		if cause == "" {
			return nil, errDesktopAsleep(rec.ID)
		}
		_, err := s.moveDesktop(ctx, p, rec.ID, cause)
		var ae *apiError
		if errors.As(err, &ae) && ae.Code == "invalid_state" {
			return nil, nil // another request moved it first: look again
		}
		return nil, err
	case desktop.Stopping:
		if rec.Goal == desktop.Stopped {
			return nil, errState("desktop is stopping, to stopped: a call does not wake a stopped desktop; start it once it is stopped (POST /v1/desktops/%s:start)", rec.ID)
		}
		if cause == "" {
			return nil, errDesktopAsleep(rec.ID)
		}
		return nil, nil // going to sleep: wake it once asleep
	case desktop.Stopped:
		return nil, errState("desktop is stopped: a stopped desktop does not wake on a call; start it first (POST /v1/desktops/%s:start)", rec.ID)
	case desktop.Failed:
		return nil, errDesktopFailed(rec)
	}
	return nil, nil // starting
}

// errDesktopAsleep is the 409 of a read (a file read or a listing) of a desktop that sleeps:
// a read is no use of the desktop, so it does not wake it (seed 001, "What counts as use").
func errDesktopAsleep(id string) *apiError {
	return errState("desktop is asleep: reading or listing its files does not wake it; wake it first (POST /v1/desktops/%s:wake), or send a file or make an MCP tool call, which wake it", id)
}

// errDesktopFailed is the 502 of a call to a desktop that could not start.
func errDesktopFailed(rec desktop.Record) *apiError {
	why := rec.Message
	if why == "" {
		why = "no reason recorded"
	}
	return &apiError{Status: 502, Type: "api_error", Code: "desktop_failed", Message: fmt.Sprintf(
		"desktop is failed: %s; start it again (POST /v1/desktops/%s:start) or delete it", why, rec.ID)}
}
