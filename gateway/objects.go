package gateway

import (
	"context"
	"errors"
	"net/http"

	"wb/session"
	"wb/store"
)

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var snap session.Snapshot
	if err := s.Store.GetObject(r.Context(), p.ID, store.KindSnapshot, r.PathValue("id"), &snap); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return errNotFound("snapshot", r.PathValue("id"))
		}
		return err
	}
	writeJSON(w, 200, snap)
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, p store.Project) error {
	return s.listObjects(w, r, p, store.KindSnapshot)
}

func (s *Server) listObjects(w http.ResponseWriter, r *http.Request, p store.Project, kind string) error {
	limit, err := queryLimit(r)
	if err != nil {
		return err
	}
	items, next, err := s.Store.ListObjects(r.Context(), p.ID, kind, limit, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, listBody(items, next))
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var snap session.Snapshot
	id := r.PathValue("id")
	if err := s.Store.GetObject(r.Context(), p.ID, store.KindSnapshot, id, &snap); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return errNotFound("snapshot", id)
		}
		return err
	}
	if err := s.Store.DeleteObject(r.Context(), p.ID, store.KindSnapshot, id); err != nil {
		return err
	}
	// The snapshot's files live on a node; the object is gone either way, so a node that
	// cannot be reached now only leaves files behind, which the log says.
	if d, ok := s.Guests.(interface {
		DeleteSnapshot(ctx context.Context, id string) error
	}); ok {
		if err := d.DeleteSnapshot(r.Context(), id); err != nil {
			s.log.Warn("delete snapshot files", "snapshot", id, "err", err)
		}
	}
	writeJSON(w, 200, map[string]any{"id": id, "object": "snapshot", "deleted": true})
	return nil
}

func (s *Server) createEndpoint(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var req struct {
		URL    string   `json:"url"`
		Events []string `json:"events"`
	}
	if err := decodeStrict(body, &req); err != nil {
		return err
	}
	ep, err := s.Webhooks.Create(r.Context(), p.ID, req.URL, req.Events)
	if err != nil {
		return err
	}
	writeJSON(w, 201, ep)
	return nil
}

func (s *Server) getEndpoint(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ep, err := s.Webhooks.Get(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, ep)
	return nil
}

func (s *Server) listEndpoints(w http.ResponseWriter, r *http.Request, p store.Project) error {
	eps, err := s.Webhooks.List(r.Context(), p.ID)
	if err != nil {
		return err
	}
	writeJSON(w, 200, listBody(eps, ""))
	return nil
}

func (s *Server) deleteEndpoint(w http.ResponseWriter, r *http.Request, p store.Project) error {
	id := r.PathValue("id")
	if err := s.Webhooks.Delete(r.Context(), p.ID, id); err != nil {
		return err
	}
	writeJSON(w, 200, map[string]any{"id": id, "object": "webhook_endpoint", "deleted": true})
	return nil
}

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request, p store.Project) error {
	limit, err := queryLimit(r)
	if err != nil {
		return err
	}
	if limit == 0 {
		limit = 10
	}
	ds, next, err := s.Webhooks.Deliveries(r.Context(), p.ID, r.PathValue("id"), limit, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, listBody(ds, next))
	return nil
}
