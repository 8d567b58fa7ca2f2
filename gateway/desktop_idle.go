package gateway

import (
	"context"
	"errors"
	"time"

	"wb/desktop"
	"wb/session"
	"wb/store"
)

// What counts as use (seed 001): an MCP tool call while it runs, a file sent, saved or
// deleted, the console's screen in a visible tab. Each calls TouchDesktop; a listing never
// does. An awake desktop falls idle DesktopIdle after its last use: its deadline sits in a
// sorted set (store.DueDesktopIdle) that runDesktopIdle waits on, so the work grows with the
// desktops that fall idle, not with the projects.

// TouchDesktop records a use of the project's desktop now: an awake one stays awake for
// DesktopIdle from now. A desktop that is not awake is left as it is (waking it is the
// caller's choice: see moveDesktop with desktop.MCP or desktop.File). Answers a 404 error
// when there is no such desktop.
func (s *Server) TouchDesktop(ctx context.Context, project, id string) error {
	awake, err := s.recordDesktopUse(ctx, project, id)
	if awake {
		s.touchDesktopSession(ctx, project, id)
	}
	return err
}

// recordDesktopUse is TouchDesktop's record of the use on the desktop itself: its last use,
// and, when it is awake, its idle deadline. It answers whether the desktop is awake; the
// caller passes the use on to its session (touchDesktopSession).
func (s *Server) recordDesktopUse(ctx context.Context, project, id string) (awake bool, err error) {
	st, err := s.Store.TouchDesktop(ctx, project, id, s.Now())
	if errors.Is(err, store.ErrNotFound) {
		return false, errNotFound("desktop", id)
	}
	if err != nil || !st.Awake() {
		return false, err
	}
	return true, s.setIdleDeadline(ctx, project, id, s.Now())
}

// touchDesktopSession passes a use of a desktop on to its session: a desktop used only
// through its screen sends no exec, and the session's node would otherwise end the session
// at the session's own idle timeout (two hours) however much the desktop is used.
func (s *Server) touchDesktopSession(ctx context.Context, project, id string) {
	rec, err := s.Store.GetDesktop(ctx, project, id)
	if err != nil || rec.SessionID == "" {
		return
	}
	sess, err := s.Store.Get(ctx, project, rec.SessionID)
	if err != nil || sess.State != session.Running {
		return
	}
	if err := s.Store.Touch(ctx, project, sess.ID); err != nil {
		s.log.Warn("desktop: touch its session", "desktop", id, "session", sess.ID, "err", err)
	}
	if g, err := s.guests(); err == nil {
		g.Touch(sess) // the node's idle timer; at most once a second per session
	}
}

func (s *Server) setIdleDeadline(ctx context.Context, project, id string, used time.Time) error {
	if err := s.Store.SetDesktopIdle(ctx, project, id, used.Add(s.desktopIdle())); err != nil {
		return err
	}
	select {
	case s.idleKick <- struct{}{}:
	default:
	}
	return nil
}

// runDesktopIdle puts to sleep the desktops whose idle deadline passed unused, until ctx ends.
func (s *Server) runDesktopIdle(ctx context.Context) {
	runDeadlines(ctx, s, "desktop idle: read deadlines", s.Store.DueDesktopIdle, s.idleDesktop, s.idleKick)
}

// idleDesktop handles one due deadline: a running desktop unused since is put to sleep, one
// used since gets its new deadline, and any other leaves the set.
func (s *Server) idleDesktop(ctx context.Context, ref store.DesktopRef, now time.Time) {
	rec, err := s.Store.GetDesktop(ctx, ref.Project, ref.ID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && rec.State != desktop.Running) {
		_ = s.Store.ForgetDesktopIdle(ctx, ref.Project, ref.ID, now)
		return
	}
	if err != nil {
		s.log.Warn("desktop idle: read", "desktop", ref.ID, "err", err)
		return
	}
	used := rec.UpdatedAt.Time
	if rec.LastUsedAt != nil {
		used = rec.LastUsedAt.Time
	}
	if deadline := used.Add(s.desktopIdle()); deadline.After(now) {
		_ = s.Store.SetDesktopIdle(ctx, ref.Project, ref.ID, deadline)
		return
	}
	p, err := s.Store.GetProject(ctx, ref.Project)
	if err != nil {
		s.log.Warn("desktop idle: read the project", "project", ref.Project, "err", err)
		return
	}
	if _, err := s.moveDesktop(ctx, p, ref.ID, desktop.Idle); err != nil {
		var used *store.DesktopUsedError
		if errors.As(err, &used) { // used since it was read: awake until its new deadline
			_ = s.Store.SetDesktopIdle(ctx, ref.Project, ref.ID, used.At.Add(s.desktopIdle()))
			return
		}
		var ae *apiError
		if !errors.As(err, &ae) || ae.Status != 409 {
			s.log.Warn("desktop idle: sleep", "desktop", ref.ID, "err", err)
			return
		}
	}
	_ = s.Store.ForgetDesktopIdle(ctx, ref.Project, ref.ID, now)
}
