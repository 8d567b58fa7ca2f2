package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// placementDoneScript ends a round of placement under the lock: if another placer asked for a
// round meanwhile, the lock is kept (and its lease renewed) for one more; else it is released.
//
// KEYS: lock, again flag
// ARGV: token, lease ms
// Answers 1: place again, still holding; 0: released; -1: the lock was lost.
var placementDoneScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
return 0
`)

// PlacementLease bounds how long a placer may hold a project's placement lock without
// finishing a round; a placer that dies holding it delays the project's placements this long.
const PlacementLease = 10 * time.Second

// Placement is a held placement lock of one project (see LockPlacement).
type Placement struct {
	s       *Store
	project string
	token   string
}

// LockPlacement serializes placement of one project's sessions across placers, so that the
// check of the project's share of a node and the placements it allows are one step. When
// another placer holds the lock it answers nil and asks that placer for another round, so no
// pending session waits for a sweep.
func (s *Store) LockPlacement(ctx context.Context, project string) (*Placement, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	k := ProjectKeys(project)
	ok, err := s.rdb.SetNX(ctx, k.placing(), token, PlacementLease).Result()
	if err != nil {
		return nil, fmt.Errorf("lock placement of %s: %w", project, err)
	}
	if !ok {
		if err := s.rdb.Set(ctx, k.placeAgain(), 1, PlacementLease).Err(); err != nil {
			return nil, fmt.Errorf("ask for another placement round of %s: %w", project, err)
		}
		// The holder may have finished before it could see the request: try once more.
		if ok, err = s.rdb.SetNX(ctx, k.placing(), token, PlacementLease).Result(); err != nil {
			return nil, fmt.Errorf("lock placement of %s: %w", project, err)
		}
		if !ok {
			return nil, nil
		}
	}
	return &Placement{s: s, project: project, token: token}, nil
}

// Done ends a round. It answers true when another round was asked for meanwhile: the lock is
// still held, and the caller places again and calls Done again.
func (p *Placement) Done(ctx context.Context) (again bool, err error) {
	k := ProjectKeys(p.project)
	n, err := placementDoneScript.Run(ctx, p.s.rdb, []string{k.placing(), k.placeAgain()}, p.token, PlacementLease.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("end placement round of %s: %w", p.project, err)
	}
	if n < 0 {
		return false, fmt.Errorf("placement lock of %s expired during a round (longer than %v)", p.project, PlacementLease)
	}
	return n == 1, nil
}

// releaseScript deletes the lock if this placer still holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// Release gives the lock up without another round (the placer is stopping).
func (p *Placement) Release(ctx context.Context) error {
	if err := releaseScript.Run(ctx, p.s.rdb, []string{ProjectKeys(p.project).placing()}, p.token).Err(); err != nil {
		return fmt.Errorf("release placement lock of %s: %w", p.project, err)
	}
	return nil
}
