package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A project lock serializes one kind of work on one project across workers (placers,
// settlers), with a lease, and a flag by which a worker that found it held asks the holder
// for another round, so no work waits for a sweep.

// roundDoneScript ends a round under the lock: if another worker asked for a round meanwhile,
// the lock is kept (and its lease renewed) for one more; else it is released.
//
// KEYS: lock, again flag
// ARGV: token, lease ms
// Answers 1: go again, still holding; 0: released; -1: the lock was lost.
var roundDoneScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
return 0
`)

// PlacementLease bounds how long a worker may hold a project lock without finishing a round
// (or renewing it); a worker that dies holding it delays the project's work this long.
const PlacementLease = 10 * time.Second

// ProjectLock is a held lock on one kind of work of one project (LockPlacement,
// LockSettlement).
type ProjectLock struct {
	s           *Store
	what        string // "placement", "settlement": for errors
	project     string
	lock, again string
	token       string
}

// LockPlacement serializes placement of one project's sessions across placers, so that the
// check of the project's share of a node and the placements it allows are one step. When
// another placer holds the lock it answers nil and asks that placer for another round.
func (s *Store) LockPlacement(ctx context.Context, project string) (*ProjectLock, error) {
	k := ProjectKeys(project)
	return s.lockProject(ctx, "placement", project, k.placing(), k.placeAgain())
}

// LockSettlement serializes settling one project's usage across settlers: the settle script
// is exactly-once by each session's seq, so records settled out of order (a later batch on
// one settler before an earlier one on another) would count the earlier ones as replays.
// When another settler holds the lock it answers nil and asks that settler for another round.
func (s *Store) LockSettlement(ctx context.Context, project string) (*ProjectLock, error) {
	k := ProjectKeys(project)
	return s.lockProject(ctx, "settlement", project, k.settling(), k.settleAgain())
}

func (s *Store) lockProject(ctx context.Context, what, project, lock, again string) (*ProjectLock, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	ok, err := s.rdb.SetNX(ctx, lock, token, PlacementLease).Result()
	if err != nil {
		return nil, fmt.Errorf("lock %s of %s: %w", what, project, err)
	}
	if !ok {
		if err := s.rdb.Set(ctx, again, 1, PlacementLease).Err(); err != nil {
			return nil, fmt.Errorf("ask for another %s round of %s: %w", what, project, err)
		}
		// The holder may have finished before it could see the request: try once more.
		if ok, err = s.rdb.SetNX(ctx, lock, token, PlacementLease).Result(); err != nil {
			return nil, fmt.Errorf("lock %s of %s: %w", what, project, err)
		}
		if !ok {
			return nil, nil
		}
	}
	return &ProjectLock{s: s, what: what, project: project, lock: lock, again: again, token: token}, nil
}

// Done ends a round. It answers true when another round was asked for meanwhile: the lock is
// still held, and the caller works again and calls Done again.
func (p *ProjectLock) Done(ctx context.Context) (again bool, err error) {
	n, err := roundDoneScript.Run(ctx, p.s.rdb, []string{p.lock, p.again}, p.token, PlacementLease.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("end %s round of %s: %w", p.what, p.project, err)
	}
	if n < 0 {
		return false, fmt.Errorf("%s lock of %s expired during a round (longer than %v)", p.what, p.project, PlacementLease)
	}
	return n == 1, nil
}

// renewScript extends the lease if this worker still holds the lock.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
`)

// Renew extends the lease of a long round (one step at a time); it answers an error when the
// lock was lost.
func (p *ProjectLock) Renew(ctx context.Context) error {
	n, err := renewScript.Run(ctx, p.s.rdb, []string{p.lock}, p.token, PlacementLease.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("renew %s lock of %s: %w", p.what, p.project, err)
	}
	if n == 0 {
		return fmt.Errorf("%s lock of %s expired during a round (a step longer than %v)", p.what, p.project, PlacementLease)
	}
	return nil
}

// releaseScript deletes the lock if this worker still holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// Release gives the lock up without another round (the worker is stopping or failed).
func (p *ProjectLock) Release(ctx context.Context) error {
	if err := releaseScript.Run(ctx, p.s.rdb, []string{p.lock}, p.token).Err(); err != nil {
		return fmt.Errorf("release %s lock of %s: %w", p.what, p.project, err)
	}
	return nil
}
