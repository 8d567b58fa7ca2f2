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
// ARGV: op (set, renew, keep, claim, release, ensure, yield), member, token, until ms, now ms
//
// keep is renew that also takes a lease with no holder (one its holder failed to set, which
// the placer's sweep may have given an end since). ensure sets a lease only where there is
// none, held by token (empty: no holder), and answers whether it did. yield takes the end
// off a lease and makes token its holder, if it has an end: no recovery claims it, and its
// holder's renewals and release fail (token's lease is elsewhere, a shard: shardedLeases).
var leaseScript = redis.NewScript(`
local op, m, tok = ARGV[1], ARGV[2], ARGV[3]
if op == 'yield' then
  if redis.call('ZREM', KEYS[1], m) == 0 then return 0 end
  redis.call('HSET', KEYS[2], m, tok)
  return 1
end
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

// writeDesktopAndSnapshotLeasesInShards is whether this release writes the desktops' and the
// snapshots' leases in their shards (false: in their legacy pairs, as the gateways and placers
// from before the shards do). False in this release: those older binaries read and write only
// the legacy pairs, so a lease written in a shard is invisible to them (their leaseOrphan and
// the placer's sweep would ensure one beside it, and their recovery would claim that and run
// the work a second time beside this binary's; their set would not supersede it). This
// release writes its leases where they look, and reads, claims and ensures against the shards
// too, so that the next release, which sets this true and writes only in the shards, may roll
// out over this one. Flip it only in a release that no binary older than this one runs beside.
// The runs' leases stay in their shards: a run's attempt is leased only by its own gateway
// and a recovery (no binary ensures or sets a lease on another's attempt), so an older
// gateway that does not see it does not take it over.
const writeDesktopAndSnapshotLeasesInShards = false

// shardedLeases is a lease set spread over workShards shards (workShardKeys), the leases on
// one thing in the shard of its id, rather than in one pair of keys (one Cluster slot) that
// all the fleet's work writes. Its legacy pair is that one, which gateways older than the
// shards read and write (keys.go says what each binary reads). This binary writes its leases
// in one of the two (own: the shards when inShards) and reads the other too: it answers its
// due leases, claims them into its own, and leaves alone (or supersedes) those that run there.
type shardedLeases struct {
	set, what string
	legacy    leaseKeys
	// supersedes: a set gives the lease to its token whoever held it (the work of a newer
	// request supersedes the older), so it also takes the end off a lease of the other keys
	// (whose holder, another binary's work, no longer renews it, as when set replaced it).
	supersedes bool
	// inShards: this binary writes its leases in the shards (false: in the legacy pair;
	// writeDesktopAndSnapshotLeasesInShards says why and until when).
	inShards bool
}

func newShardedLeases(set, what, legacyEnds, legacyHolders string, supersedes, inShards bool) shardedLeases {
	return shardedLeases{set: set, what: what, legacy: leaseKeys{ends: legacyEnds, holders: legacyHolders, what: what},
		supersedes: supersedes, inShards: inShards}
}

// shard is the shard that holds the leases on id.
func (l shardedLeases) shard(id string) leaseKeys {
	ends, holders := workShardKeys(l.set, workShard(id))
	return leaseKeys{ends: ends, holders: holders, what: l.what}
}

// keys answers the keys of the leases on id that this binary writes (own), and the others
// that it reads (the legacy pair's or the shard's, another release's leases).
func (l shardedLeases) keys(id string) (own, other leaseKeys) {
	if l.inShards {
		return l.shard(id), l.legacy
	}
	return l.legacy, l.shard(id)
}

// allEnds names the ends of every shard, and the legacy pair's last.
func (l shardedLeases) allEnds() []string {
	keys := make([]string, 0, workShards+1)
	for i := range workShards {
		ends, _ := workShardKeys(l.set, i)
		keys = append(keys, ends)
	}
	return append(keys, l.legacy.ends)
}

// shardedLease runs op on the lease of member (on id) in this binary's keys for id (own),
// with what the other keys need: an ensure sets no lease where they have one (another
// binary's work holds it); a set, when l supersedes, takes the end off one there (yield); a
// claim that does not apply in its own keys is tried there (claimSharded). Renew, keep and
// release are of this binary's leases, which are in its own keys.
func (s *Store) shardedLease(ctx context.Context, l shardedLeases, op, member, id, token string, until, now time.Time) (bool, error) {
	own, other := l.keys(id)
	switch op {
	case "claim":
		_, ok, err := s.claimSharded(ctx, l, member, id, func(leaseKeys) (string, error) { return token, nil }, now, until)
		return ok, err
	case "ensure":
		_, err := s.rdb.ZScore(ctx, other.ends, member).Result()
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, redis.Nil) {
			return false, fmt.Errorf("ensure the work lease of %s %s: read the lease set of another release: %w", l.what, id, err)
		}
	}
	ok, err := s.lease(ctx, own, op, member, id, token, until, now)
	if err != nil || op != "set" || !l.supersedes {
		return ok, err
	}
	_, err = s.lease(ctx, other, "yield", member, id, token, until, now)
	return ok, err
}

// claimSharded claims the lease of member (on id) until until, if it ended at or before now,
// for the holder that token answers for the keys the lease is in; it answers that holder. A
// claim that does not apply in this binary's own keys for id is tried in the other keys
// (another release's work): one that applies there moves to its own (where this binary renews
// and releases it), unless they have a lease on member (a newer work's, which supersedes it),
// and the other keys keep its holder, with no end (yield). A recovery that dies between the
// move and the yield leaves the lease in both, ending together; so a claim that applies in
// its own keys also yields the other's (the next recovery takes both), or the copy left
// there would be due, and claimed again, once this one's work was done and released. (One
// that still runs there, which only a race of two binaries' steps leaves, is superseded, as
// a set supersedes it: the claim's work resumes the transition.)
func (s *Store) claimSharded(ctx context.Context, l shardedLeases, member, id string, token func(leaseKeys) (string, error), now, until time.Time) (string, bool, error) {
	own, other := l.keys(id)
	holder, err := token(own)
	if err != nil {
		return "", false, err
	}
	ok, err := s.lease(ctx, own, "claim", member, id, holder, until, now)
	if err != nil {
		return holder, false, err
	}
	if ok {
		_, err := s.lease(ctx, other, "yield", member, id, holder, until, now)
		return holder, err == nil, err
	}
	if holder, err = token(other); err != nil {
		return "", false, err
	}
	if ok, err := s.lease(ctx, other, "claim", member, id, holder, until, now); err != nil || !ok {
		return holder, false, err
	}
	moved, err := s.lease(ctx, own, "ensure", member, id, holder, until, now)
	if err != nil {
		return holder, false, err
	}
	if _, err := s.lease(ctx, other, "yield", member, id, holder, until, now); err != nil {
		return holder, false, err
	}
	return holder, moved, nil
}

// Leases on a session's snapshot: the gateway that moves a session to snapshotting holds a
// lease whose token is the snapshot's id until it has moved the session back to running. No
// other transition leaves snapshotting, so a gateway that died in between would leave the
// session there, billed and undeletable, for ever; the lease lets another gateway end it.

// snapshotLeaseSet is the snapshots' lease set, written in its shards when inShards (the
// store's: writeDesktopAndSnapshotLeasesInShards).
func snapshotLeaseSet(inShards bool) shardedLeases {
	return newShardedLeases("snapshots", "the snapshot of session", snapshotWorkKey, snapshotWorkerKey, true, inShards)
}

func (s *Store) snapshotWork(ctx context.Context, op string, ref SessionRef, snapshot string, until, now time.Time) (bool, error) {
	return s.shardedLease(ctx, s.snapshotLeases, op, ref.member(), ref.ID, snapshot, until, now)
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
	// A snapshot begun between the read and the claim holds a lease that has not ended, so
	// the claim fails: the holder answered is the one claimed.
	return s.claimSharded(ctx, s.snapshotLeases, ref.member(), ref.ID, func(l leaseKeys) (string, error) {
		holder, err := s.rdb.HGet(ctx, l.holders, ref.member()).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return "", fmt.Errorf("read the snapshot lease of session %s: %w", ref.ID, err)
		}
		return holder, nil
	}, now, until)
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
// earliest first, from every shard and the legacy pair (an older gateway's, during a rolling
// deploy), and when the next lease after them ends (zero: none; now: more are due).
func (s *Store) DueSnapshotWork(ctx context.Context, now time.Time, limit int) ([]SessionRef, time.Time, error) {
	return dueDeadlinesIn(ctx, s, s.snapshotLeases.allEnds(), "snapshot lease", now, limit, parseRef)
}
