package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
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
// check of the project's share of a node and the placements it allows are one step. It
// answers nil when the project has no pending session (pending false: nothing to place), or
// when another placer holds the lock, which it then asks for another round. Looking and
// locking are one round trip: a placement is on the path of every create.
func (s *Store) LockPlacement(ctx context.Context, project string) (lock *ProjectLock, pending bool, err error) {
	k := ProjectKeys(project)
	lock, res, err := s.lockProject(ctx, "placement", project, k.placing(), k.placeAgain(), k.byState(session.Pending))
	return lock, res != lockNoWork, err
}

// LockSettlement serializes settling one project's usage across settlers: the settle script
// is exactly-once by each session's seq, so records settled out of order (a later batch on
// one settler before an earlier one on another) would count the earlier ones as replays.
// When another settler holds the lock it answers nil and asks that settler for another round.
func (s *Store) LockSettlement(ctx context.Context, project string) (*ProjectLock, error) {
	k := ProjectKeys(project)
	lock, _, err := s.lockProject(ctx, "settlement", project, k.settling(), k.settleAgain())
	return lock, err
}

// lockScript takes a project lock, or asks its holder for another round; with a third key,
// only if that sorted set (the work to do) is not empty.
//
// KEYS: lock, again flag[, work]
// ARGV: token, lease ms
// Answers lockNoWork, lockTaken or lockHeld.
var lockScript = redis.NewScript(`
if KEYS[3] and redis.call('ZCARD', KEYS[3]) == 0 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 2
`)

const (
	lockNoWork = 0
	lockTaken  = 1
	lockHeld   = 2
)

func (s *Store) lockProject(ctx context.Context, what, project string, keys ...string) (*ProjectLock, int, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	res, err := lockScript.Run(ctx, s.rdb, keys, token, PlacementLease.Milliseconds()).Int()
	if err != nil {
		return nil, 0, fmt.Errorf("lock %s of %s: %w", what, project, err)
	}
	if res != lockTaken {
		return nil, res, nil
	}
	return &ProjectLock{s: s, what: what, project: project, lock: keys[0], again: keys[1], token: token}, res, nil
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

// PlacementView is what one placement round of a project works from.
type PlacementView struct {
	// Pending is the project's oldest pending sessions, up to the round's most; More says
	// some pending sessions are not in it (behind them, or unreadable).
	Pending []*session.Session
	More    bool
	Nodes   []NodeInfo
	Project Project
	// Usage is what the project's placed live sessions hold on each node; Claims is the live
	// claims on each node (Store.ClaimOnNode), of every project.
	Usage, Claims map[string]NodeUse
}

// ReadPlacement reads a placement round's view of project in two round trips (the ids, then
// what they name): a placement is on the path of every create, and its reads one by one
// were most of its time. Claims are those made within window before now, read of the nodes
// that candidate answers true for (the live ones, say: a fleet's other nodes cost nothing).
func (s *Store) ReadPlacement(ctx context.Context, project string, most int64, now time.Time, window time.Duration, candidate func(NodeInfo) bool) (*PlacementView, error) {
	k := ProjectKeys(project)
	var pending, draining, active *redis.StringSliceCmd
	var nodes, proj *redis.MapStringStringCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		pending = p.ZRangeByLex(ctx, k.byState(session.Pending), &redis.ZRangeBy{Min: "-", Max: "+", Count: most})
		nodes = p.HGetAll(ctx, NodesKey)
		draining = p.SMembers(ctx, NodesDrainingKey)
		proj = p.HGetAll(ctx, k.project())
		active = p.SMembers(ctx, k.active())
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read placement of %s: %w", project, err)
	}
	v := &PlacementView{More: int64(len(pending.Val())) == most}
	var err error
	if v.Project, err = projectFromHash(project, proj.Val()); err != nil {
		return nil, fmt.Errorf("read placement of %s: project: %w", project, err)
	}
	if v.Nodes, err = nodesFrom(nodes.Val(), draining.Val()); err != nil {
		return nil, fmt.Errorf("read placement of %s: %w", project, err)
	}
	ids := pending.Val()
	if len(ids) == 0 {
		v.Usage, v.Claims = map[string]NodeUse{}, map[string]NodeUse{}
		return v, nil
	}
	var nodeIDs []string
	for _, n := range v.Nodes {
		if candidate(n) {
			nodeIDs = append(nodeIDs, n.ID)
		}
	}
	sessions := make([]*redis.MapStringStringCmd, len(ids))
	usage := make([]*redis.SliceCmd, len(active.Val()))
	claims := make([]*redis.StringSliceCmd, len(nodeIDs))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			sessions[i] = p.HGetAll(ctx, k.session(id))
		}
		for i, id := range active.Val() {
			usage[i] = p.HMGet(ctx, k.session(id), "node", "doc")
		}
		for i, n := range nodeIDs {
			claims[i] = liveClaims(ctx, p, n, now, window)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read placement of %s: %w", project, err)
	}
	for _, c := range sessions {
		if len(c.Val()) == 0 {
			continue // deleted since its id was read
		}
		sess, err := decode(c.Val())
		if err != nil {
			v.More = true // it stays pending; the rest of the round goes on without it
			continue
		}
		if sess.State == session.Pending {
			v.Pending = append(v.Pending, sess)
		}
	}
	if v.Usage, err = usageFrom(project, usage); err != nil {
		return nil, err
	}
	v.Claims = claimsFrom(nodeIDs, claims)
	return v, nil
}
