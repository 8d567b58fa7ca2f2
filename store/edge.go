package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// edgeSecretLen is the size of the edge secret in bytes.
const edgeSecretLen = 32

// EdgeSecret returns the secret that gateways and nodes share to sign and verify the edge's
// grants, creating it on first use: the first reader's random value wins (SET NX), and every
// other reader gets that one.
func (s *Store) EdgeSecret(ctx context.Context) ([]byte, error) {
	b, err := s.rdb.Get(ctx, edgeSecretKey).Bytes()
	if err == nil && len(b) == edgeSecretLen {
		return b, nil
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the edge secret: %w", err)
	}
	if err == nil {
		return nil, fmt.Errorf("the edge secret in %s has %d bytes, not %d: delete the key to make a new one", edgeSecretKey, len(b), edgeSecretLen)
	}
	fresh := make([]byte, edgeSecretLen)
	_, _ = rand.Read(fresh) // never fails (crypto/rand)
	if err := s.rdb.SetNX(ctx, edgeSecretKey, fresh, 0).Err(); err != nil {
		return nil, fmt.Errorf("write the edge secret: %w", err)
	}
	b, err = s.rdb.Get(ctx, edgeSecretKey).Bytes()
	if err != nil {
		return nil, fmt.Errorf("read the edge secret: %w", err)
	}
	return b, nil
}
