package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"wb/session"
	"wb/store"
	"wb/webhooks"
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
	limit, err := queryLimit(r)
	if err != nil {
		return err
	}
	items, next, err := s.Store.ListObjects(r.Context(), p.ID, store.KindSnapshot, limit, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	snaps := make([]session.Snapshot, len(items))
	for i, raw := range items {
		if err := json.Unmarshal(raw, &snaps[i]); err != nil {
			return fmt.Errorf("list snapshots: stored snapshot %d of the page: %w", i, err)
		}
	}
	writeJSON(w, 200, session.NewList(snaps, next))
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
	writeJSON(w, 200, session.DeletedObject{ID: id, Object: "snapshot", Deleted: true})
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
	// With an Idempotency-Key the endpoint is named after the key's ref, which every request
	// holding the key in turn shares: a retry that took the key over from a gateway that died
	// mid-create answers the endpoint that one made (with its secret), not a second one that
	// would be sent every event again.
	id := ""
	if ref := idemRefOf(r.Context()).ref; ref != "" {
		id = webhooks.EndpointPrefix + ref
	}
	ep, err := s.Webhooks.CreateAs(r.Context(), p.ID, id, req.URL, req.Events)
	if err != nil {
		return err
	}
	writeJSON(w, 201, WebhookEndpointCreated{WebhookEndpoint: endpointObject(ep), Secret: ep.Secret})
	return nil
}

func (s *Server) getEndpoint(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ep, err := s.Webhooks.Get(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, endpointObject(ep))
	return nil
}

func (s *Server) listEndpoints(w http.ResponseWriter, r *http.Request, p store.Project) error {
	eps, err := s.Webhooks.List(r.Context(), p.ID)
	if err != nil {
		return err
	}
	out := make([]WebhookEndpoint, len(eps))
	for i, ep := range eps {
		out[i] = endpointObject(ep)
	}
	writeJSON(w, 200, session.NewList(out, ""))
	return nil
}

func (s *Server) deleteEndpoint(w http.ResponseWriter, r *http.Request, p store.Project) error {
	id := r.PathValue("id")
	if err := s.Webhooks.Delete(r.Context(), p.ID, id); err != nil {
		return err
	}
	writeJSON(w, 200, session.DeletedObject{ID: id, Object: "webhook_endpoint", Deleted: true})
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
	writeJSON(w, 200, session.NewList(ds, next))
	return nil
}
