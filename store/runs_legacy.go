package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Runs saved before each had a key of its own (ae79e3d) are in one hash per project,
// wb:{PROJECT}:obj:run (id → JSON), indexed by the sorted set wb:{PROJECT}:idx:run, with no
// TTL: GET /v1/runs/{id} no longer found them. They move, one at a time, to keys of their own
// with what is left of the retention from their last change (finished_at, else started_at,
// else created_at); one past it is dropped, as a run of its own key would have expired. A run
// still queued or running there never ends (no gateway writes that hash any more): it moves
// failed, with the message of a run whose gateway stopped (session.RunOrphaned). GetRun moves the one it
// reads; MigrateLegacyRuns, which every gateway calls as it starts, moves the rest once.

// legacyKindRun is the kind under which runs were objects (ProjectKeys.objects).
const legacyKindRun = "run"

// errLegacyUndecodable: a legacy run that is not a run's JSON, moved as it is.
var errLegacyUndecodable = errors.New("decode legacy run")

// moveLegacyRunScript moves one run out of the legacy hash.
//
// KEYS: the legacy hash, its index, the run's own key. ARGV: id, the run's JSON (empty:
// drop it), TTL ms. The run's own key, if one is there, is left as it is.
var moveLegacyRunScript = redis.NewScript(`
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' then redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3], 'NX') end
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[2]) end
return 1
`)

// moveLegacyRun moves run id, raw as the legacy hash held it, to its own key, and answers it
// as moved (nil: past its retention, dropped).
func (s *Store) moveLegacyRun(ctx context.Context, project, id string, raw []byte) (*session.Run, error) {
	var run session.Run
	now := s.now()
	if err := json.Unmarshal(raw, &run); err != nil {
		// Moved as it is, with the whole retention: no reader can tell more of it.
		k := ProjectKeys(project)
		if merr := moveLegacyRunScript.Run(ctx, s.rdb, []string{k.objects(legacyKindRun), k.objIndex(legacyKindRun), k.run(id)},
			id, raw, s.retention.Milliseconds()).Err(); merr != nil {
			return nil, fmt.Errorf("move legacy run %s: %w", id, merr)
		}
		return nil, fmt.Errorf("%w %s: %w", errLegacyUndecodable, id, err)
	}
	last := run.CreatedAt.Time
	switch {
	case run.State != session.RunSucceeded && run.State != session.RunFailed:
		orphan := session.RunOrphaned
		run.State, run.Error, run.FinishedAt = session.RunFailed, &orphan, session.At(now)
		last = now
	case run.FinishedAt != nil:
		last = run.FinishedAt.Time
	case run.StartedAt != nil:
		last = run.StartedAt.Time
	}
	if last.IsZero() || last.After(now) {
		last = now
	}
	ttl := s.retention - now.Sub(last)
	var b []byte
	if ttl >= time.Millisecond {
		var err error
		if b, err = encodeRun(&run, ""); err != nil {
			return nil, err
		}
	}
	k := ProjectKeys(project)
	if err := moveLegacyRunScript.Run(ctx, s.rdb, []string{k.objects(legacyKindRun), k.objIndex(legacyKindRun), k.run(id)},
		id, b, ttl.Milliseconds()).Err(); err != nil {
		return nil, fmt.Errorf("move legacy run %s: %w", id, err)
	}
	if b == nil {
		return nil, nil
	}
	return &run, nil
}

// getLegacyRun reads run id from the legacy hash and moves it (ErrNotFound: not there, or
// past its retention).
func (s *Store) getLegacyRun(ctx context.Context, project, id string) (*session.Run, error) {
	raw, err := s.rdb.HGet(ctx, ProjectKeys(project).objects(legacyKindRun), id).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	run, err := s.moveLegacyRun(ctx, project, id, raw)
	if err == nil && run == nil {
		err = ErrNotFound
	}
	return run, err
}

// MigrateLegacyRuns moves every project's legacy runs to keys of their own, and answers how
// many it moved (dropped ones included). Once it has been through every project it marks it
// done, and later calls are one read; until then each call starts again, and moving a run
// twice is moving it once.
func (s *Store) MigrateLegacyRuns(ctx context.Context) (int, error) {
	if n, err := s.rdb.Exists(ctx, legacyRunsMovedKey).Result(); err != nil || n == 1 {
		if err != nil {
			err = fmt.Errorf("legacy runs: %w", err)
		}
		return 0, err
	}
	moved := 0
	var cursor uint64
	for {
		projects, next, err := s.rdb.SScan(ctx, ProjectsKey, cursor, "", 100).Result()
		if err != nil {
			return moved, fmt.Errorf("legacy runs: list projects: %w", err)
		}
		for _, p := range projects {
			n, err := s.migrateProjectRuns(ctx, p)
			moved += n
			if err != nil {
				return moved, err
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if err := s.rdb.Set(ctx, legacyRunsMovedKey, s.now().UTC().Format(time.RFC3339), 0).Err(); err != nil {
		return moved, fmt.Errorf("legacy runs: mark them moved: %w", err)
	}
	return moved, nil
}

// migrateProjectRuns moves one project's legacy runs, a batch of ids from the index at a time
// (the hash's values are up to 16 MiB each: they are read one by one), then any the index
// missed.
func (s *Store) migrateProjectRuns(ctx context.Context, project string) (int, error) {
	k := ProjectKeys(project)
	moved := 0
	move := func(ids []string) error {
		for _, id := range ids {
			raw, err := s.rdb.HGet(ctx, k.objects(legacyKindRun), id).Bytes()
			if errors.Is(err, redis.Nil) { // moved meanwhile (a GetRun), or an index entry alone
				err = s.rdb.ZRem(ctx, k.objIndex(legacyKindRun), id).Err()
			} else if err == nil {
				if _, err = s.moveLegacyRun(ctx, project, id, raw); errors.Is(err, errLegacyUndecodable) {
					err = nil // moved as it is: GetRun says what is wrong with it
				}
				moved++
			}
			if err != nil {
				return fmt.Errorf("legacy runs of %s: %w", project, err)
			}
		}
		return nil
	}
	for {
		// Each batch leaves the index: the next is again at its start.
		ids, err := s.rdb.ZRange(ctx, k.objIndex(legacyKindRun), 0, 99).Result()
		if err != nil {
			return moved, fmt.Errorf("legacy runs of %s: %w", project, err)
		}
		if len(ids) == 0 {
			break
		}
		if err := move(ids); err != nil {
			return moved, err
		}
	}
	ids, err := s.rdb.HKeys(ctx, k.objects(legacyKindRun)).Result()
	if err != nil {
		return moved, fmt.Errorf("legacy runs of %s: %w", project, err)
	}
	return moved, move(ids)
}
