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

// PutRun writes (or overwrites) a run, readable for the retention from now.
func (s *Store) PutRun(ctx context.Context, project string, run *session.Run) error {
	b, err := json.Marshal(run)
	if err != nil {
		return fmt.Errorf("encode run %s: %w", run.ID, err)
	}
	if err := s.rdb.Set(ctx, ProjectKeys(project).run(run.ID), b, s.retention).Err(); err != nil {
		return fmt.Errorf("put run %s: %w", run.ID, err)
	}
	return nil
}

// GetRun reads a run, or answers ErrNotFound (never written, or past its retention).
func (s *Store) GetRun(ctx context.Context, project, id string) (*session.Run, error) {
	b, err := s.rdb.Get(ctx, ProjectKeys(project).run(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	var run session.Run
	if err := json.Unmarshal(b, &run); err != nil {
		return nil, fmt.Errorf("decode run %s: %w", id, err)
	}
	return &run, nil
}
