package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// HoldCapStop records a crossed spend cap's stop that left sessions live, under id (a field
// of CapStops), for a later round to carry on, and indexes the project: written, then
// indexed, as ForgetCapStopProject expects.
func (s *Store) HoldCapStop(ctx context.Context, project, id, stop string, ttl time.Duration) error {
	k := ProjectKeys(project).CapStops()
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k, id, stop)
		p.Expire(ctx, k, ttl)
		return nil
	}); err != nil {
		return fmt.Errorf("hold the spend-cap stop of %s: %w", project, err)
	}
	return s.IndexCapStops(ctx, project)
}

// IndexCapStops adds project to the projects with held spend-cap stops. A stop written by a
// script of the caller's (quota.Caps, with the cap's flag) is indexed before, so that a crash
// in between leaves it found, and again after, as HoldCapStop does (ForgetCapStopProject).
func (s *Store) IndexCapStops(ctx context.Context, project string) error {
	if err := s.rdb.SAdd(ctx, capStopProjectsKey, project).Err(); err != nil {
		return fmt.Errorf("index the spend-cap stop of %s: %w", project, err)
	}
	return nil
}

// CapStopProjects answers the projects with held spend-cap stops (perhaps none left): one
// command, whatever the number of projects.
func (s *Store) CapStopProjects(ctx context.Context) ([]string, error) {
	ps, err := s.rdb.SMembers(ctx, capStopProjectsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("projects with spend-cap stops: %w", err)
	}
	return ps, nil
}

// CapStops answers project's held spend-cap stops, id → what HoldCapStop was given.
func (s *Store) CapStops(ctx context.Context, project string) (map[string]string, error) {
	m, err := s.rdb.HGetAll(ctx, ProjectKeys(project).CapStops()).Result()
	if err != nil {
		return nil, fmt.Errorf("spend-cap stops of %s: %w", project, err)
	}
	return m, nil
}

// endCapStopScript drops a stop only if it is still the one read: a cap crossed again
// meanwhile (after a raise) holds a stop of its own under the same id.
var endCapStopScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
`)

// EndCapStop drops the held stop id of project if it is still stop (done, or its month over).
func (s *Store) EndCapStop(ctx context.Context, project, id, stop string) error {
	if err := endCapStopScript.Run(ctx, s.rdb, []string{ProjectKeys(project).CapStops()}, id, stop).Err(); err != nil {
		return fmt.Errorf("end the spend-cap stop of %s: %w", project, err)
	}
	return nil
}

// ForgetCapStopProject drops project from the projects with held stops if it holds none. It
// removes first and checks after, so a stop held meanwhile (written, then indexed) is either
// seen here and indexed again, or indexed after the removal.
func (s *Store) ForgetCapStopProject(ctx context.Context, project string) error {
	return s.forgetIndexed(ctx, capStopProjectsKey, ProjectKeys(project).CapStops(), project)
}

// forgetIndexed drops project from the index set if its hash is empty, as
// ForgetCapStopProject says.
func (s *Store) forgetIndexed(ctx context.Context, set, hash, project string) error {
	if err := s.rdb.SRem(ctx, set, project).Err(); err != nil {
		return fmt.Errorf("forget the spend-cap stops of %s: %w", project, err)
	}
	n, err := s.rdb.HLen(ctx, hash).Result()
	if err != nil {
		return fmt.Errorf("count the spend-cap stops of %s: %w", project, err)
	}
	if n > 0 {
		if err := s.rdb.SAdd(ctx, set, project).Err(); err != nil {
			return fmt.Errorf("index the spend-cap stops of %s: %w", project, err)
		}
	}
	return nil
}

// The undecided stops (CapUndecided) are hard caps' crossings not yet decided, kept apart
// from the held stops, with an index of their own: settlers older than them read every held
// stop as one to carry on (they would stop the sessions before any decision), and forget a
// project whose held stops they do not see.

// IndexCapUndecided adds project to the projects with undecided stops. quota.Caps writes the
// stop with the cap's flag in a script of its own, and indexes the project before (a crash
// after the script leaves the stop found) and after (ForgetCapUndecidedProject).
func (s *Store) IndexCapUndecided(ctx context.Context, project string) error {
	if err := s.rdb.SAdd(ctx, capUndecidedProjectsKey, project).Err(); err != nil {
		return fmt.Errorf("index the undecided spend-cap stop of %s: %w", project, err)
	}
	return nil
}

// CapUndecidedProjects answers the projects with undecided stops (perhaps none left).
func (s *Store) CapUndecidedProjects(ctx context.Context) ([]string, error) {
	ps, err := s.rdb.SMembers(ctx, capUndecidedProjectsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("projects with undecided spend-cap stops: %w", err)
	}
	return ps, nil
}

// CapUndecided answers project's undecided stops, id → the stop as quota.Caps wrote it (or
// as ReplaceCapUndecided replaced it).
func (s *Store) CapUndecided(ctx context.Context, project string) (map[string]string, error) {
	m, err := s.rdb.HGetAll(ctx, ProjectKeys(project).CapUndecided()).Result()
	if err != nil {
		return nil, fmt.Errorf("undecided spend-cap stops of %s: %w", project, err)
	}
	return m, nil
}

// replaceCapUndecidedScript replaces an undecided stop only if it is still the one read and
// its cap still crossed (one of KEYS[2..] there, its flag or lifted mark); one whose cap was
// raised (its flag deleted by a binary that knows nothing of undecided stops) is dropped.
var replaceCapUndecidedScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if #KEYS > 1 and redis.call('EXISTS', unpack(KEYS, 2)) == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
`)

// ReplaceCapUndecided replaces the undecided stop id of project with stop if it is still old
// and one of the keys crossed (the cap's flag, its lifted mark: keys of project) is there,
// answering whether it was: one caller of several that read it takes it over (to decide it),
// and none decides a cap raised meanwhile.
func (s *Store) ReplaceCapUndecided(ctx context.Context, project, id, old, stop string, crossed []string) (bool, error) {
	keys := append([]string{ProjectKeys(project).CapUndecided()}, crossed...)
	n, err := replaceCapUndecidedScript.Run(ctx, s.rdb, keys, id, old, stop).Int64()
	if err != nil {
		return false, fmt.Errorf("take over the undecided spend-cap stop of %s: %w", project, err)
	}
	return n == 1, nil
}

// EndCapUndecided drops the undecided stop id of project if it is still stop (decided, or
// its month over).
func (s *Store) EndCapUndecided(ctx context.Context, project, id, stop string) error {
	if err := endCapStopScript.Run(ctx, s.rdb, []string{ProjectKeys(project).CapUndecided()}, id, stop).Err(); err != nil {
		return fmt.Errorf("end the undecided spend-cap stop of %s: %w", project, err)
	}
	return nil
}

// ForgetCapUndecidedProject drops project from the projects with undecided stops if it has
// none, as ForgetCapStopProject does for the held ones.
func (s *Store) ForgetCapUndecidedProject(ctx context.Context, project string) error {
	return s.forgetIndexed(ctx, capUndecidedProjectsKey, ProjectKeys(project).CapUndecided(), project)
}
