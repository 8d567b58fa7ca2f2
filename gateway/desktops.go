package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"wb/desktop"
	"wb/session"
	"wb/store"
)

// The desktop API (/v1/desktops): the handlers check the request and the desktop's state
// against desktop's table, write the state the desktop enters at once, and leave the work
// behind it (sessions, snapshots) to desktop_engine.go.

func (s *Server) desktopRoutes(api func(pattern string, h handler)) {
	api("POST /v1/desktops", s.idempotent(s.createDesktop))
	api("GET /v1/desktops", s.stallBounded(s.listDesktops)) // up to 100 desktops: tens of kilobytes
	api("GET /v1/desktops/{id}", s.getDesktop)
	api("PATCH /v1/desktops/{id}", s.patchDesktop)
	api("DELETE /v1/desktops/{id}", s.deleteDesktop)
	api("POST /v1/desktops/{id}", s.idempotent(s.desktopAction)) // {id}:sleep, :wake, :stop, :start
	s.desktopConsoleRoutes(api)
	s.desktopUseRoutes(api)
}

func (s *Server) createDesktop(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req desktop.CreateRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	size, err := req.Validate()
	if err != nil {
		return err
	}
	// With an Idempotency-Key the desktop is named after the key's ref, which every request
	// holding the key in turn shares: a retry that took the key over from a gateway that died
	// mid-create answers the desktop that one made, rather than make (and bill) a second.
	now := s.Now()
	id := session.NewID(desktop.IDPrefix, now)
	ir := idemRefOf(r.Context())
	if ir.ref != "" {
		id = desktop.IDPrefix + ir.ref
		if ir.resumed {
			if done, err := s.createdDesktop(w, r, p, id); done || err != nil {
				return err
			}
		}
	}
	if err := s.desktopRoom(r.Context(), size, ""); err != nil {
		return err
	}
	rec := desktop.Record{Desktop: desktop.Desktop{ID: id, Object: desktop.ObjectName, ProjectID: p.ID, Name: req.Name,
		Size: size, State: desktop.Starting, MCPURL: s.PublicURL + "/v1/desktops/" + id + "/mcp", CreatedAt: *session.At(now)}}
	if err := s.leaseAhead(r.Context(), p.ID, id); err != nil {
		return err
	}
	out, err := s.Store.CreateDesktop(r.Context(), rec, desktop.MaxPerProject)
	if ir.ref != "" && errors.Is(err, store.ErrDesktopChanged) { // made by the dead request meanwhile
		if done, err := s.createdDesktop(w, r, p, id); done || err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	s.transitionWork(p.ID, id, func() bool { return s.startDesktop(p, out, false, nil) })
	writeJSON(w, 201, out.Public())
	return nil
}

// createdDesktop answers desktop id as its create did (201), if it exists: one made by an
// earlier request with the same Idempotency-Key. done is false when there is none.
func (s *Server) createdDesktop(w http.ResponseWriter, r *http.Request, p store.Project, id string) (done bool, err error) {
	rec, err := s.Store.GetDesktop(r.Context(), p.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	writeJSON(w, 201, s.reconcileDesktop(r.Context(), p, rec).Public())
	return true, nil
}

func (s *Server) loadDesktop(r *http.Request, p store.Project, id string) (desktop.Record, error) {
	rec, err := s.Store.GetDesktop(r.Context(), p.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return rec, errNotFound("desktop", id)
	}
	return rec, err
}

func (s *Server) getDesktop(w http.ResponseWriter, r *http.Request, p store.Project) error {
	rec, err := s.loadDesktop(r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	rec = s.reconcileDesktop(r.Context(), p, rec)
	s.leaseOrphan(r.Context(), rec)
	writeJSON(w, 200, rec.Public())
	return nil
}

// listDesktops lists without touching: a listing is no use of a desktop.
func (s *Server) listDesktops(w http.ResponseWriter, r *http.Request, p store.Project) error {
	limit, err := queryLimit(r)
	if err != nil {
		return err
	}
	recs, next, err := s.Store.ListDesktops(r.Context(), p.ID, limit, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	out := make([]desktop.Desktop, len(recs))
	for i, rec := range recs {
		out[i] = rec.Public()
	}
	writeJSON(w, 200, session.NewList(out, next))
	return nil
}

// patchDesktop resizes (seed 001, "Changing the size"); an asleep desktop's saved state,
// taken at the old size, is dropped.
func (s *Server) patchDesktop(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req desktop.PatchRequest
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	if req.Size == nil {
		return errInvalid("size", "is required: the new size, one of %v", desktop.Sizes())
	}
	size, err := desktop.ParseSize("size", *req.Size)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		rec, err := s.loadDesktop(r, p, r.PathValue("id"))
		if err != nil {
			return err
		}
		next, dropped := desktop.Resize(rec, size)
		if dropped != "" {
			next.Message = "state not saved: the desktop was resized while asleep"
		}
		out, err := s.Store.PutDesktop(r.Context(), next, rec.State)
		if errors.Is(err, store.ErrDesktopChanged) && attempt < 5 {
			continue
		}
		if err != nil {
			return err
		}
		if dropped != "" {
			s.dropSnapshot(r.Context(), p.ID, dropped)
		}
		writeJSON(w, 200, out.Public())
		return nil
	}
}

func (s *Server) deleteDesktop(w http.ResponseWriter, r *http.Request, p store.Project) error {
	id := r.PathValue("id")
	rec, err := s.Store.DeleteDesktop(r.Context(), p.ID, id)
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("desktop", id)
	}
	if err != nil {
		return err
	}
	// Whatever was under way for it finds it gone and cleans up what it made.
	s.goBackground(func() { s.removeDesktop(p, rec) })
	writeJSON(w, 200, session.DeletedObject{ID: id, Object: desktop.ObjectName, Deleted: true})
	return nil
}

// desktopAction serves POST /v1/desktops/{id}:sleep, :wake, :stop and :start.
func (s *Server) desktopAction(w http.ResponseWriter, r *http.Request, p store.Project) error {
	id, action, ok := strings.Cut(r.PathValue("id"), ":")
	causes := map[string]desktop.Cause{"sleep": desktop.Sleep, "wake": desktop.Wake, "stop": desktop.Stop, "start": desktop.Start}
	cause, known := causes[action]
	if !ok || !known {
		return &apiError{Status: 404, Type: "not_found", Code: "no_route", Message: fmt.Sprintf("POST /v1/desktops/{id} needs an action: :sleep, :wake, :stop or :start, got %q", action)}
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	if err := emptyBody(body); err != nil {
		return err
	}
	out, err := s.moveDesktop(r.Context(), p, id, cause)
	if err != nil {
		return err
	}
	status := 202 // the desktop passes through starting or stopping
	if out.State == desktop.Stopped {
		status = 200 // an asleep desktop stops at once
	}
	writeJSON(w, status, out.Public())
	return nil
}
