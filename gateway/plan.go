package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"wb/session"
	"wb/store"
)

// The plan is the operator's: PUT /v1/admin/projects/{id}/plan sets it with the admin key. A
// tenant's PUT /v1/limits may only lower it (store.LowerLimits); raising is 403 plan_limit.

// isAdmin reports whether r carries the admin key.
func (s *Server) isAdmin(r *http.Request) bool {
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return s.AdminKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.AdminKey)) == 1
}

// admin wraps an operator route: it answers 401 without the admin key.
func (s *Server) admin(h func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.isAdmin(r) {
			s.writeError(w, r, &apiError{Status: 401, Type: "unauthenticated", Code: "unauthenticated", Message: "this route needs the admin key"})
			return
		}
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func (s *Server) adminGetPlan(w http.ResponseWriter, r *http.Request) error {
	p, err := s.Store.GetProject(r.Context(), r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound("project", r.PathValue("id"))
	}
	if err != nil {
		return err
	}
	writeJSON(w, 200, ProjectPlan{Object: "plan", ProjectID: p.ID, Plan: p.Granted})
	return nil
}

// adminPutPlan sets a project's plan limits; fields left out keep their value.
func (s *Server) adminPutPlan(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	var req store.PlanChange
	if err := decodeStrict(b, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.Store.SetPlan(r.Context(), id, req); errors.Is(err, store.ErrNotFound) {
		return errNotFound("project", id)
	} else if err != nil {
		return err
	}
	// SetPlan returned once every gateway dropped the project (caches.go); this one again, in
	// case its own subscription is late.
	s.auth.forget(id)
	return s.adminGetPlan(w, r)
}

// adminRevokeKey: DELETE /v1/admin/projects/{id}/keys/{prefix} revokes the project's API key
// whose first characters are prefix (store.KeyPrefix). It answers once every gateway has
// dropped the key: from then on it is refused everywhere.
func (s *Server) adminRevokeKey(w http.ResponseWriter, r *http.Request) error {
	id, prefix := r.PathValue("id"), r.PathValue("prefix")
	if err := s.Store.RevokeAPIKey(r.Context(), id, prefix); errors.Is(err, store.ErrNotFound) {
		return &apiError{Status: 404, Type: "not_found", Code: "not_found",
			Message: fmt.Sprintf("project %q has no API key with prefix %q (a key's prefix is its first 16 characters; a key made before keys were indexed is found once it has been used)", id, prefix)}
	} else if err != nil {
		return err
	}
	s.auth.forget(id)
	writeJSON(w, 200, APIKeyRevoked{Object: "api_key", ProjectID: id, Prefix: prefix, Revoked: true})
	return nil
}

// errPlanLimit is a 403 for a request past one of the plan's limits.
func errPlanLimit(param, format string, args ...any) *apiError {
	return &apiError{Status: 403, Type: "denied", Code: "plan_limit", Param: param, Message: fmt.Sprintf(format, args...)}
}

// snapshotRoom refuses a snapshot before any work when the project is already at its plan's
// snapshot count or bytes (recordSnapshot checks again, atomically, once the size is known).
// It answers the project, whose plan recordSnapshot then holds the snapshot to.
func (s *Server) snapshotRoom(ctx context.Context, project string) (store.Project, error) {
	p, err := s.Store.GetProject(ctx, project)
	if err != nil {
		return p, err
	}
	n, used, err := s.Store.SnapshotUsage(ctx, project)
	if err != nil {
		return p, err
	}
	if n+1 > p.SnapshotCount {
		return p, errPlanLimit("snapshot_count", "the project keeps %d snapshots and its plan allows %d (snapshot_count); delete one with DELETE /v1/snapshots/{id}", n, p.SnapshotCount)
	}
	if used+1 > p.SnapshotBytes() {
		return p, errPlanLimit("snapshot_gib", "the project's snapshots hold %d bytes and its plan allows %d GiB (snapshot_gib); delete snapshots with DELETE /v1/snapshots/{id}", used, p.SnapshotGiB)
	}
	return p, nil
}

// recordSnapshot records a snapshot just taken, if the project's plan has room for it; one
// that does not fit has its files deleted from the node, and the refusal is answered. The
// check and the record are one step in the store, so snapshots taken at once cannot pass
// the plan together.
func (s *Server) recordSnapshot(ctx context.Context, p store.Project, snap session.SnapshotRecord) error {
	err := s.Store.PutSnapshot(ctx, p.ID, snap.ID, snap, max(snap.SizeBytes, 1), p.SnapshotCount, p.SnapshotBytes())
	var le *store.SnapshotLimitError
	if !errors.As(err, &le) {
		return err
	}
	if d, ok := s.Guests.(interface {
		DeleteSnapshot(ctx context.Context, id string) error
	}); ok {
		if derr := d.DeleteSnapshot(ctx, snap.ID); derr != nil {
			s.log.Warn("delete snapshot files past the plan", "snapshot", snap.ID, "err", derr)
		}
	}
	if le.Limit == "snapshot_count" {
		return errPlanLimit("snapshot_count", "the project keeps %d snapshots and its plan allows %d (snapshot_count); delete one with DELETE /v1/snapshots/{id}", le.Count, p.SnapshotCount)
	}
	return errPlanLimit("snapshot_gib", "the project's snapshots would hold %d bytes and its plan allows %d GiB (snapshot_gib); delete snapshots with DELETE /v1/snapshots/{id}", le.Bytes+snap.SizeBytes, p.SnapshotGiB)
}
