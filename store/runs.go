package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// A run is a JSON document under a key of its own (ProjectKeys.run) that expires the store's
// retention after its last write, as an ended session does: a run keeps up to MaxOutputBytes
// of each stream, and a project that loops runs must not fill, for ever, the Redis that every
// project shares. There is no list of runs to index.
//
// The record also names the attempt that made it (owner, never shown by the API): with an
// Idempotency-Key, every request that holds the key in turn works on the same run id, and
// CreateRun lets exactly one of them make the record, and so run the command.

// storedRun is a run as stored: the API object and the attempt that owns it.
type storedRun struct {
	*session.Run
	Owner string `json:"owner,omitempty"`
}

func encodeRun(run *session.Run, owner string) ([]byte, error) {
	b, err := json.Marshal(storedRun{Run: run, Owner: owner})
	if err != nil {
		return nil, fmt.Errorf("encode run %s: %w", run.ID, err)
	}
	return b, nil
}

// CreateRun writes a new run, owned by the attempt owner, unless one with its id exists
// already: false then, and that one is left as it is. Of the requests that share a run id
// (those that hold one Idempotency-Key in turn) only the one that created the record runs
// the command; the others answer the record.
func (s *Store) CreateRun(ctx context.Context, project string, run *session.Run, owner string) (bool, error) {
	b, err := encodeRun(run, owner)
	if err != nil {
		return false, err
	}
	created, err := s.rdb.SetNX(ctx, ProjectKeys(project).run(run.ID), b, s.retention).Result()
	if err != nil {
		return false, fmt.Errorf("create run %s: %w", run.ID, err)
	}
	return created, nil
}

// PutRun writes (or overwrites) a run, readable for the retention from now.
func (s *Store) PutRun(ctx context.Context, project string, run *session.Run) error {
	b, err := encodeRun(run, "")
	if err != nil {
		return err
	}
	if err := s.rdb.Set(ctx, ProjectKeys(project).run(run.ID), b, s.retention).Err(); err != nil {
		return fmt.Errorf("put run %s: %w", run.ID, err)
	}
	return nil
}

// GetRun reads a run, or answers ErrNotFound (never written, or past its retention).
func (s *Store) GetRun(ctx context.Context, project, id string) (*session.Run, error) {
	run, _, err := s.GetRunOwner(ctx, project, id)
	return run, err
}

// GetRunOwner is GetRun that also answers the attempt that owns the run ("" for one written
// by PutRun, or before owners were recorded).
func (s *Store) GetRunOwner(ctx context.Context, project, id string) (*session.Run, string, error) {
	b, err := s.rdb.Get(ctx, ProjectKeys(project).run(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, "", ErrNotFound
	}
	if err != nil {
		return nil, "", fmt.Errorf("get run %s: %w", id, err)
	}
	rec := storedRun{Run: &session.Run{}}
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, "", fmt.Errorf("decode run %s: %w", id, err)
	}
	return rec.Run, rec.Owner, nil
}
