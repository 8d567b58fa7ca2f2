package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Work leases: work that one gateway does and another must take over should that one die (a
// desktop's transition, a session's snapshot). The gateway doing the work holds a lease (a
// token and an end time) and renews it while it works; a lease that ends unrenewed is claimed
// by another gateway's recovery loop, which resumes or ends the work.

// leaseKeys names one family of leases: a sorted set of members by the time (ms) at which
// each lease ends, and a hash from the same member to its holder's token, both in one hash
// slot (one script writes both).
type leaseKeys struct{ ends, holders, what string }

// leaseScript sets, renews, claims or releases a lease, comparing tokens.
//
// KEYS: the ends set, the holders hash
// ARGV: op (set, renew, keep, claim, release, ensure), member, token, until ms, now ms
//
// keep is renew that also takes a lease with no holder (one its holder failed to set, which
// the placer's sweep may have given an end since). ensure sets a lease only where there is
// none, held by token (empty: no holder), and answers whether it did.
var leaseScript = redis.NewScript(`
local op, m, tok = ARGV[1], ARGV[2], ARGV[3]
if op == 'ensure' then
  if redis.call('ZADD', KEYS[1], 'NX', ARGV[4], m) == 0 then return 0 end
  if tok ~= '' then redis.call('HSET', KEYS[2], m, tok) else redis.call('HDEL', KEYS[2], m) end
  return 1
end
local holder = redis.call('HGET', KEYS[2], m) or '' -- '': no holder
if op == 'keep' then
  if holder ~= '' and holder ~= tok then return 0 end
elseif op == 'renew' or op == 'release' then
  if holder ~= tok then return 0 end
  if op == 'release' then
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
    return 1
  end
elseif op == 'claim' then
  local ends = redis.call('ZSCORE', KEYS[1], m)
  if not ends or tonumber(ends) > tonumber(ARGV[5]) then return 0 end
end
redis.call('ZADD', KEYS[1], ARGV[4], m)
if tok == '' then
  redis.call('HDEL', KEYS[2], m) -- no holder (a claim of a lease whose holder is unknown)
else
  redis.call('HSET', KEYS[2], m, tok)
end
return 1
`)

// lease runs one op on the lease of member (id names it in errors); false when the op did
// not apply (renew, release: token does not hold it; claim: it has not ended).
func (s *Store) lease(ctx context.Context, l leaseKeys, op, member, id, token string, until, now time.Time) (bool, error) {
	n, err := leaseScript.Run(ctx, s.rdb, []string{l.ends, l.holders},
		op, member, token, until.UnixMilli(), now.UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("%s the work lease of %s %s: %w", op, l.what, id, err)
	}
	return n == 1, nil
}

// Leases on a session's snapshot: the gateway that moves a session to snapshotting holds a
// lease whose token is the snapshot's id until it has moved the session back to running. No
// other transition leaves snapshotting, so a gateway that died in between would leave the
// session there, billed and undeletable, for ever; the lease lets another gateway end it.

var snapshotLeases = leaseKeys{ends: snapshotWorkKey, holders: snapshotWorkerKey, what: "the snapshot of session"}

func (s *Store) snapshotWork(ctx context.Context, op string, ref SessionRef, snapshot string, until, now time.Time) (bool, error) {
	return s.lease(ctx, snapshotLeases, op, ref.member(), ref.ID, snapshot, until, now)
}

// SetSnapshotWork gives the session's snapshot to lease holder snapshot (the snapshot's id)
// until until, whoever held it before.
func (s *Store) SetSnapshotWork(ctx context.Context, ref SessionRef, snapshot string, until time.Time) error {
	_, err := s.snapshotWork(ctx, "set", ref, snapshot, until, until)
	return err
}

// RenewSnapshotWork extends the lease of snapshot to until, taking it if it has no holder
// (its gateway's SetSnapshotWork failed); false when another snapshot holds it.
func (s *Store) RenewSnapshotWork(ctx context.Context, ref SessionRef, snapshot string, until time.Time) (bool, error) {
	return s.snapshotWork(ctx, "keep", ref, snapshot, until, until)
}

// ReleaseSnapshotWork ends the lease of snapshot (the session left snapshotting); false when
// it no longer held it.
func (s *Store) ReleaseSnapshotWork(ctx context.Context, ref SessionRef, snapshot string) (bool, error) {
	return s.snapshotWork(ctx, "release", ref, snapshot, time.Time{}, time.Time{})
}

// ClaimSnapshotWork takes over the session's snapshot lease until until if it ended at or
// before now, and answers the snapshot that held it ("" when unknown), which holds it still:
// a recovery that dies in turn leaves the lease to the next one as it found it. False when
// the lease still runs, or there is none.
func (s *Store) ClaimSnapshotWork(ctx context.Context, ref SessionRef, now, until time.Time) (string, bool, error) {
	holder, err := s.rdb.HGet(ctx, snapshotWorkerKey, ref.member()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", false, fmt.Errorf("read the snapshot lease of session %s: %w", ref.ID, err)
	}
	// A snapshot begun between the read and the claim holds a lease that has not ended, so
	// the claim fails: the holder answered is the one claimed.
	ok, err := s.snapshotWork(ctx, "claim", ref, holder, until, now)
	return holder, ok, err
}

// EnsureSnapshotWork gives a session in snapshotting whose lease is missing (its gateway died
// before taking it, the key was lost, or it is from before leases) one that ends at until,
// held by the snapshot the session takes (as its transition to snapshotting recorded it;
// holder unknown for a session without one), so that the lease's recovery ends the session's
// snapshotting only while it takes that snapshot. One already recorded stays as it is.
func (s *Store) EnsureSnapshotWork(ctx context.Context, ref SessionRef, until time.Time) error {
	taking := func() (string, error) {
		snap, err := s.rdb.HGet(ctx, ProjectKeys(ref.Project).session(ref.ID), "snap").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return "", fmt.Errorf("ensure the snapshot lease of session %s: read its snapshot: %w", ref.ID, err)
		}
		return snap, nil
	}
	snap, err := taking()
	if err != nil {
		return err
	}
	set, err := s.snapshotWork(ctx, "ensure", ref, snap, until, until)
	if err != nil || !set || snap == "" {
		return err
	}
	// The read and the lease are two steps (in two hash slots on a Cluster): a session that
	// left that snapshot in between must not get a lease in its name, whose recovery would
	// record it failed. Its release lets go only of a lease that snapshot still holds.
	if now, err := taking(); err != nil || now != snap {
		_, rerr := s.snapshotWork(ctx, "release", ref, snap, time.Time{}, time.Time{})
		return errors.Join(err, rerr)
	}
	return nil
}

// DueSnapshotWork answers up to limit sessions whose snapshot lease ended at or before now,
// earliest first, and when the next lease after them ends (zero: none; now: more are due).
func (s *Store) DueSnapshotWork(ctx context.Context, now time.Time, limit int) ([]SessionRef, time.Time, error) {
	return dueDeadlines(ctx, s, snapshotWorkKey, "snapshot lease", now, limit, parseRef)
}
