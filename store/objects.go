package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Objects other than sessions and runs (snapshots) are JSON documents in one hash per kind and
// project, with a lexicographic index for newest-first lists.

// Kinds of stored objects.
const (
	KindSnapshot = "snapshot"
)

// PutObject writes (or overwrites) an object of kind with id.
func (s *Store) PutObject(ctx context.Context, project, kind, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s %s: %w", kind, id, err)
	}
	k := ProjectKeys(project)
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k.objects(kind), id, b)
		p.ZAdd(ctx, k.objIndex(kind), redis.Z{Member: id})
		return nil
	})
	if err != nil {
		return fmt.Errorf("put %s %s: %w", kind, id, err)
	}
	if kind == KindSnapshot {
		return s.indexSnapshotProject(ctx, project)
	}
	return nil
}

// PutObjectIfAbsent writes an object of kind with id unless one is there already; false when
// one was (it is left as it was).
func (s *Store) PutObjectIfAbsent(ctx context.Context, project, kind, id string, v any) (bool, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return false, fmt.Errorf("encode %s %s: %w", kind, id, err)
	}
	k := ProjectKeys(project)
	var set *redis.BoolCmd
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		set = p.HSetNX(ctx, k.objects(kind), id, b)
		p.ZAddNX(ctx, k.objIndex(kind), redis.Z{Member: id})
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("put %s %s: %w", kind, id, err)
	}
	if set.Val() && kind == KindSnapshot {
		return true, s.indexSnapshotProject(ctx, project)
	}
	return set.Val(), nil
}

// GetObject reads an object into v, or answers ErrNotFound.
func (s *Store) GetObject(ctx context.Context, project, kind, id string, v any) error {
	b, err := s.rdb.HGet(ctx, ProjectKeys(project).objects(kind), id).Bytes()
	if errors.Is(err, redis.Nil) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("get %s %s: %w", kind, id, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %s %s: %w", kind, id, err)
	}
	return nil
}

// DeleteObject removes an object; ErrNotFound if there was none.
func (s *Store) DeleteObject(ctx context.Context, project, kind, id string) error {
	k := ProjectKeys(project)
	var del *redis.IntCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		del = p.HDel(ctx, k.objects(kind), id)
		p.ZRem(ctx, k.objIndex(kind), id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete %s %s: %w", kind, id, err)
	}
	if del.Val() == 0 {
		return ErrNotFound
	}
	return nil
}

// ListObjects answers up to limit raw objects of kind, newest first, after cursor.
func (s *Store) ListObjects(ctx context.Context, project, kind string, limit int, cursor string) ([]json.RawMessage, string, error) {
	if limit == 0 {
		limit = 10
	}
	if limit < 1 || limit > MaxListLimit {
		return nil, "", &session.FieldError{Field: "limit", Message: fmt.Sprintf("must be 1–%d, got %d", MaxListLimit, limit)}
	}
	max := "+"
	if cursor != "" {
		if !validCursor(cursor) {
			return nil, "", &session.FieldError{Field: "cursor", Message: "not a cursor this API returned"}
		}
		max = "(" + cursor
	}
	k := ProjectKeys(project)
	ids, err := s.rdb.ZRevRangeByLex(ctx, k.objIndex(kind), &redis.ZRangeBy{Max: max, Min: "-", Count: int64(limit + 1)}).Result()
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", kind, err)
	}
	next := ""
	if len(ids) > limit {
		ids = ids[:limit]
		next = ids[limit-1]
	}
	if len(ids) == 0 {
		return nil, "", nil
	}
	vals, err := s.rdb.HMGet(ctx, k.objects(kind), ids...).Result()
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", kind, err)
	}
	out := make([]json.RawMessage, 0, len(vals))
	for _, v := range vals {
		if str, ok := v.(string); ok {
			out = append(out, json.RawMessage(str))
		}
	}
	return out, next, nil
}
