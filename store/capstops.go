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

// endCapStopScript drops a held stop only if it is still the one read: a cap crossed again
// meanwhile (after a raise) holds a stop of its own under the same id.
var endCapStopScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
`)

// replaceCapStopScript replaces a held stop only if it is still the one read.
var replaceCapStopScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) return 1 end
return 0
`)

// ReplaceCapStop replaces the held stop id of project with stop if it is still old, answering
// whether it was: one caller of several that read it takes it over.
func (s *Store) ReplaceCapStop(ctx context.Context, project, id, old, stop string) (bool, error) {
	n, err := replaceCapStopScript.Run(ctx, s.rdb, []string{ProjectKeys(project).CapStops()}, id, old, stop).Int64()
	if err != nil {
		return false, fmt.Errorf("take over the spend-cap stop of %s: %w", project, err)
	}
	return n == 1, nil
}

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
	if err := s.rdb.SRem(ctx, capStopProjectsKey, project).Err(); err != nil {
		return fmt.Errorf("forget the spend-cap stops of %s: %w", project, err)
	}
	n, err := s.rdb.HLen(ctx, ProjectKeys(project).CapStops()).Result()
	if err != nil {
		return fmt.Errorf("count the spend-cap stops of %s: %w", project, err)
	}
	if n > 0 {
		if err := s.rdb.SAdd(ctx, capStopProjectsKey, project).Err(); err != nil {
			return fmt.Errorf("index the spend-cap stops of %s: %w", project, err)
		}
	}
	return nil
}
