package gateway

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"time"

	"wb/desktop"
	"wb/desktop/guest"
	"wb/internal/stallwrite"
	"wb/store"
)

// What the web console (wb/console) needs of a desktop beyond its object: its screen, and a
// heartbeat while the screen is open in a visible tab (seed 001, "What counts as use").
// Neither ever wakes a desktop: looking at a sleeping desktop is no reason to pay for it.

// DefaultDesktopScreenTimeout bounds one screenshot (Config.DesktopScreenTimeout): the
// console asks again every few seconds.
const DefaultDesktopScreenTimeout = 30 * time.Second

func (s *Server) desktopConsoleRoutes(api func(pattern string, h handler)) {
	api("GET /v1/desktops/{id}/screen", s.desktopScreenCall(s.desktopScreen))
	api("POST /v1/desktops/{id}/heartbeat", s.desktopHeartbeat)
}

// desktopScreen answers a PNG of a running desktop's display. It is not a use: a console
// left open keeps a desktop awake by its heartbeat, which stops when the tab is hidden.
func (s *Server) desktopScreen(w http.ResponseWriter, r *http.Request, p store.Project) error {
	rec, err := s.loadDesktop(r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	rec = s.reconcileDesktop(r.Context(), p, rec)
	if rec.State != desktop.Running || rec.SessionID == "" {
		return errState("desktop %s is %s: only a running desktop has a screen (Wake or Start it first)", rec.ID, rec.State)
	}
	sess, err := s.Store.Get(r.Context(), p.ID, rec.SessionID)
	if errors.Is(err, store.ErrNotFound) {
		return errState("desktop %s has no session now: it is going to sleep or stopping; try again", rec.ID)
	}
	if err != nil {
		return err
	}
	wait := cmp.Or(s.DesktopScreenTimeout, DefaultDesktopScreenTimeout)
	late := errGuestTimeout("the desktop's guest", wait)
	ctx, cancel := context.WithTimeoutCause(r.Context(), wait, late)
	defer cancel()
	png, err := guest.Screenshot(ctx, sessionExecer{s: s, sess: sess})
	if err != nil {
		// The exec's own timeout, a whole second under the bound, may end it first.
		var timedOut *execTimedOut
		if errors.Is(context.Cause(ctx), late) || errors.As(err, &timedOut) {
			return late
		}
		var ae *apiError
		if errors.As(err, &ae) {
			return ae
		}
		s.log.Warn("desktop: screenshot", "desktop", rec.ID, "session", sess.ID, "err", err)
		return &apiError{Status: 502, Type: "api_error", Code: "screen_unavailable",
			Message: "the desktop's screen could not be read: " + redactInternal(err.Error()) + "; try again"}
	}
	// A caller that stays connected but takes none of the PNG for WriteStall ends the call,
	// which would otherwise hold it (its slot among the project's file calls, the PNG's
	// megabytes) for as long as the caller stayed.
	sw := stallwrite.New(w, s.WriteStall)
	defer sw.Close()
	sw.Header().Set("Content-Type", "image/png")
	sw.Header().Set("Cache-Control", "no-store")
	sw.WriteHeader(http.StatusOK)
	if _, err := sw.Write(png); err != nil {
		s.log.WarnContext(r.Context(), "desktop: a screenshot broke off", "desktop", rec.ID, "err", err)
	}
	return nil
}

// desktopHeartbeat records a use of an awake desktop: the console sends it while its screen
// is open in a visible tab. An asleep, stopped or failed desktop is left as it is; either
// way it answers the desktop, so the console learns its state.
func (s *Server) desktopHeartbeat(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	if err := emptyBody(body); err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.TouchDesktop(r.Context(), p.ID, id); err != nil {
		return err
	}
	rec, err := s.loadDesktop(r, p, id)
	if err != nil {
		return err
	}
	writeJSON(w, 200, rec.Public())
	return nil
}
