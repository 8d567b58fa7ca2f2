package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/store"
)

// accrueScript bills one snapshot's storage from its last accrual to now, once: a run that
// finds the snapshot already accrued up to (or past) now changes nothing, and one that finds
// it accrued to another point than the cost was computed from answers -1 ("moved": another
// settler accrued it meanwhile), so that the caller computes the cost again.
// KEYS: accrual hash, spend hash, hour bucket, hours index, days index, months index
// (settleScript). ARGV: snapshot id, from ms, to ms, cost nano, hour, day, month, created ms
// (the last accrual of one never accrued), hour's start ms, day's start ms, month's end ms.
var accrueScript = redis.NewScript(`
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or ARGV[8])
if tonumber(ARGV[3]) <= last then return {0, 0} end
if last ~= tonumber(ARGV[2]) then return {-1, 0} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local cost = ARGV[4]
local m = redis.call('HINCRBY', KEYS[2], 'm:' .. ARGV[7], cost)
redis.call('HINCRBY', KEYS[2], 'd:' .. ARGV[6], cost)
redis.call('HINCRBY', KEYS[2], 'h:' .. ARGV[5], cost)
redis.call('ZADD', KEYS[4], ARGV[9], 'h:' .. ARGV[5])
redis.call('ZADD', KEYS[5], ARGV[10], 'd:' .. ARGV[6])
redis.call('ZADD', KEYS[6], ARGV[11], 'm:' .. ARGV[7])
redis.call('HINCRBY', KEYS[3], 't:cost_nano', cost)
redis.call('HINCRBY', KEYS[3], 't:snapshot_cost_nano', cost)
redis.call('EXPIRE', KEYS[3], 34560000)
return {1, m}
`)

// SnapshotCost is the storage price of size bytes for ms, in nano-USD.
func (p Prices) SnapshotCost(size, ms int64) int64 {
	// size × ms × (micro-USD per GiB-month × 1000 nano) / (2^30 bytes × ms per month), in
	// big integers: the product overflows int64 for large snapshots.
	n := new(big.Int).Mul(big.NewInt(size), big.NewInt(ms))
	n.Mul(n, big.NewInt(p.SnapshotGiBMonth*1000))
	n.Quo(n, new(big.Int).Mul(big.NewInt(1<<30), big.NewInt(msPerMonth)))
	return n.Int64()
}

// AccrueSnapshots bills every ready snapshot for its storage up to now. It visits only the
// projects with snapshots (store.SnapshotProjects), and drops those it finds with none.
// Run it periodically (the settler does, every AccrueEvery); each run is idempotent. A
// snapshot (or project) whose accrual fails is left for the next run, and the others are
// billed: the error answered names the first failures and counts the rest. A run that meets
// Redis away (accrualAwayAfter connection failures in a row) ends there, and leaves the rest
// to the next run: each accrual would wait for its own dial timeout.
func (s *Settler) AccrueSnapshots(ctx context.Context, now time.Time) error {
	projects, err := s.store.SnapshotProjects(ctx)
	if err != nil {
		return err
	}
	var r accrualRound
	for _, p := range projects {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !s.accrueProject(ctx, p, now, &r) {
			break
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return r.err()
}

// accrualErrsKept bounds the failures one accrual run answers in full; the rest are counted.
const accrualErrsKept = 5

// accrualAwayAfter is how many connection failures in a row end an accrual run: Redis is
// away (a partition, a failover), and the snapshots left would each wait for their timeout.
const accrualAwayAfter = 3

// accrualRound is an accrual run's failures: the first few, how many more, and how many
// connection failures came last in a row.
type accrualRound struct {
	errs    []error
	more    int
	inARow  int
	endedAt string // the project where the run ended, Redis away
}

// failed records err, answering whether the run goes on.
func (r *accrualRound) failed(err error) bool {
	if len(r.errs) < accrualErrsKept {
		r.errs = append(r.errs, err)
	} else {
		r.more++
	}
	if !redisAway(err) {
		r.inARow = 0
		return true
	}
	r.inARow++
	return r.inARow < accrualAwayAfter
}

// ok records an accrual (or listing) that Redis answered.
func (r *accrualRound) ok() { r.inARow = 0 }

func (r *accrualRound) err() error {
	errs := r.errs
	if r.more > 0 {
		errs = append(errs, fmt.Errorf("and %d more failures", r.more))
	}
	if r.endedAt != "" {
		errs = append(errs, fmt.Errorf("accrual ended at project %s after %d connection failures in a row: Redis is away; the next run bills the rest", r.endedAt, accrualAwayAfter))
	}
	return errors.Join(errs...)
}

// redisAway answers whether err says Redis could not be reached (rather than answering with
// an error of its own).
func redisAway(err error) bool { return store.Unavailable(err) }

// accrueProject is AccrueSnapshots for one project, recording each failure in r; it answers
// whether the run goes on (false: Redis is away).
func (s *Settler) accrueProject(ctx context.Context, p string, now time.Time, r *accrualRound) bool {
	fail := func(err error) bool {
		if r.failed(err) {
			return true
		}
		r.endedAt = p
		return false
	}
	cursor := ""
	for first := true; ; first = false {
		items, next, err := s.store.ListObjects(ctx, p, store.KindSnapshot, 100, cursor)
		if err != nil {
			return fail(fmt.Errorf("accrue snapshots of %s: %w", p, err))
		}
		r.ok()
		if first && len(items) == 0 {
			if err := s.store.ForgetSnapshotProject(ctx, p); err != nil && !fail(fmt.Errorf("accrue snapshots of %s: %w", p, err)) {
				return false
			}
		}
		for _, raw := range items {
			var snap struct {
				ID        string    `json:"id"`
				State     string    `json:"state"`
				SizeBytes int64     `json:"size_bytes"`
				CreatedAt time.Time `json:"created_at"`
			}
			if json.Unmarshal(raw, &snap) != nil || snap.State != "ready" {
				continue
			}
			if ctx.Err() != nil {
				return false
			}
			if err := s.accrue(ctx, p, snap.ID, snap.SizeBytes, snap.CreatedAt, now); err != nil {
				if !fail(fmt.Errorf("project %s: %w", p, err)) {
					return false
				}
				continue
			}
			r.ok()
		}
		if next == "" {
			return true
		}
		cursor = next
	}
}

// accrueAttempts bounds how often one accrual computes its cost again after another settler
// accrued the snapshot meanwhile: each retry follows another settler's progress, which
// happens about once a minute per settler, so a few are plenty.
const accrueAttempts = 5

func (s *Settler) accrue(ctx context.Context, project, id string, size int64, created, now time.Time) error {
	k := store.ProjectKeys(project)
	for attempt := 0; attempt < accrueAttempts; attempt++ {
		last, err := s.rdb.HGet(ctx, k.SnapshotAccrual(), id).Int64()
		if err != nil && err != redis.Nil {
			return fmt.Errorf("accrue snapshot %s: %w", id, err)
		}
		if err == redis.Nil {
			last = created.UnixMilli()
		}
		ms := now.UnixMilli() - last
		if ms <= 0 {
			return nil
		}
		cost := s.prices.SnapshotCost(size, ms)
		at := now.UTC()
		res, err := accrueScript.Run(ctx, s.rdb, []string{k.SnapshotAccrual(), k.Spend(), k.UsageHour(at), k.SpendHours(), k.SpendDays(), k.SpendMonths()},
			id, last, now.UnixMilli(), cost, at.Format("2006010215"), at.Format("20060102"), monthOf(at), created.UnixMilli(),
			at.Truncate(time.Hour).UnixMilli(), dayStart(at).UnixMilli(), monthEnd(at).UnixMilli()).Int64Slice()
		if err != nil {
			return fmt.Errorf("accrue snapshot %s: %w", id, err)
		}
		if res[0] == -1 {
			continue // another settler accrued it since the read: bill from where it left off
		}
		if res[0] == 1 && s.caps != nil {
			s.caps.observe(ctx, Record{ProjectID: project, ToMs: now.UnixMilli()}, res[1], 0)
			s.caps.act(ctx, project) // accrual holds no lock
		}
		return nil
	}
	return fmt.Errorf("accrue snapshot %s: accrued by other settlers %d times while computing its cost", id, accrueAttempts)
}
