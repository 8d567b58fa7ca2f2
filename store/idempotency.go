package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// IdempotencyTTL is how long an Idempotency-Key is remembered.
const IdempotencyTTL = 24 * time.Hour

// IdemRecord is the first answer given to an Idempotency-Key.
type IdemRecord struct {
	Fingerprint string            `json:"fp"`
	Done        bool              `json:"done"`
	Status      int               `json:"status,omitempty"`
	Header      map[string]string `json:"header,omitempty"`
	Body        []byte            `json:"body,omitempty"`
}

// ErrIdemMismatch: the key was used with another request body.
var ErrIdemMismatch = errors.New("Idempotency-Key was already used with a different request")

// ErrIdemInFlight: the first request with this key is still running.
var ErrIdemInFlight = errors.New("a request with this Idempotency-Key is still in progress")

// IdemBegin claims key for a request whose fingerprint is fp. It answers the stored record
// when the key has already been answered (same fp), ErrIdemMismatch for another fp,
// ErrIdemInFlight while the first is running, or (nil, nil) when the caller now owns the key.
func (s *Store) IdemBegin(ctx context.Context, project, key, fp string) (*IdemRecord, error) {
	k := ProjectKeys(project).idempotency(key)
	claim, _ := json.Marshal(IdemRecord{Fingerprint: fp})
	ok, err := s.rdb.SetNX(ctx, k, claim, IdempotencyTTL).Result()
	if err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	if ok {
		return nil, nil
	}
	raw, err := s.rdb.Get(ctx, k).Bytes()
	if errors.Is(err, redis.Nil) { // expired between the two calls: try once more
		return s.IdemBegin(ctx, project, key, fp)
	}
	if err != nil {
		return nil, fmt.Errorf("idempotency: %w", err)
	}
	var rec IdemRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("idempotency record: %w", err)
	}
	switch {
	case rec.Fingerprint != fp:
		return nil, ErrIdemMismatch
	case !rec.Done:
		return nil, ErrIdemInFlight
	}
	return &rec, nil
}

// IdemFinish stores the answer for key (keeping the original 24 h window).
func (s *Store) IdemFinish(ctx context.Context, project, key string, rec IdemRecord) error {
	rec.Done = true
	b, _ := json.Marshal(rec)
	if err := s.rdb.SetArgs(ctx, ProjectKeys(project).idempotency(key), b, redis.SetArgs{Mode: "XX", KeepTTL: true}).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("idempotency: %w", err)
	}
	return nil
}

// IdemRelease forgets key, so that a request that failed retryably can be sent again.
func (s *Store) IdemRelease(ctx context.Context, project, key string) error {
	return s.rdb.Del(ctx, ProjectKeys(project).idempotency(key)).Err()
}
