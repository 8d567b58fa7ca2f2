package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Global indexes that let background workers find their work without walking every
// project: the sessions each provisioning deadline falls on, the sessions on each node, the
// projects with snapshots. Each is a hint kept next to the truth (the session hash, the
// project's snapshot hash), never instead of it: its reader checks the truth before acting,
// and drops entries the truth no longer backs.
//
// On one Redis a create's or a transition's script writes these entries and the work's
// signals itself (createSignals, transitionScript), so each is one round trip (an ending
// session takes one more, to leave its node's set). On a Redis Cluster these keys live in
// other slots than the project's keys, so they cannot be written in the project's scripts:
// they are written right after the write they index, in the one round trip that also
// signals the work (afterCreate, afterTransition), so a create or a placement costs two
// round trips, not more. A crash between the two leaves an entry missing; the placer's full
// sweep (at start and every few minutes) writes it again.

// SessionRef names one session across projects, as the global indexes hold it.
type SessionRef struct{ Project, ID string }

// member is the index member: "PROJECT/SESSION" (session ids hold no "/").
func (r SessionRef) member() string { return r.Project + "/" + r.ID }

func parseRef(m string) (SessionRef, bool) {
	i := strings.LastIndexByte(m, '/')
	if i <= 0 || i == len(m)-1 {
		return SessionRef{}, false
	}
	return SessionRef{Project: m[:i], ID: m[i+1:]}, true
}

func refMembers(refs []SessionRef) []any {
	out := make([]any, len(refs))
	for i, r := range refs {
		out[i] = r.member()
	}
	return out
}

// provisionDeadline is when sess must have left pending and provisioning, by the store's
// tiers; false for a tier the store does not know (no deadline: the gateway admits only
// known tiers).
func (s *Store) provisionDeadline(sess *session.Session) (time.Time, bool) {
	t, err := s.tiers.Tier(sess.Tier)
	if err != nil {
		return time.Time{}, false
	}
	return sess.CreatedAt.Add(t.ProvisionDeadline()), true
}

// ScheduleProvisionDeadline records that the session must leave pending and provisioning by
// at, unless it already has a deadline recorded. Create records it; the placer calls this
// for sessions written before the index existed, and to move an entry its own tiers put
// later than the store's (replace).
func (s *Store) ScheduleProvisionDeadline(ctx context.Context, r SessionRef, at time.Time, replace bool) error {
	z := redis.ZAddArgs{NX: !replace, Members: []redis.Z{{Score: float64(at.UnixMilli()), Member: r.member()}}}
	if err := s.rdb.ZAddArgs(ctx, provisionDeadlinesKey, z).Err(); err != nil {
		return fmt.Errorf("schedule provisioning deadline of %s: %w", r.ID, err)
	}
	return nil
}

// DueProvisionDeadlines answers up to limit sessions whose provisioning deadline is at or
// before now, earliest first, and when the next deadline after them falls (zero: none is
// recorded; now: more than limit are due).
func (s *Store) DueProvisionDeadlines(ctx context.Context, now time.Time, limit int) ([]SessionRef, time.Time, error) {
	return dueDeadlines(ctx, s, provisionDeadlinesKey, "provisioning deadline", now, limit, parseRef)
}

// dueDeadlines reads a sorted set of deadlines (score: Unix ms): up to limit members due at
// or before now, earliest first, parsed by parse, and when the next deadline after them falls
// (zero: none; now: more than limit are due). A member parse refuses is dropped from the set.
func dueDeadlines[R any](ctx context.Context, s *Store, key, what string, now time.Time, limit int, parse func(string) (R, bool)) ([]R, time.Time, error) {
	return dueDeadlinesIn(ctx, s, []string{key}, what, now, limit, parse)
}

// dueDeadlinesIn is dueDeadlines over several sorted sets (the shards of one index), merged
// by deadline: it reads the first limit+1 members of each, in one round trip (a pipeline; on
// a Cluster, one per node), which hold the earliest limit+1 of them all. A set that cannot be
// read (its Cluster node is away) is left out: the others' are answered, with the error.
func dueDeadlinesIn[R any](ctx context.Context, s *Store, keys []string, what string, now time.Time, limit int, parse func(string) (R, bool)) ([]R, time.Time, error) {
	type deadline struct {
		key string
		z   redis.Z
	}
	var zs []deadline
	var errs []error
	if len(keys) == 1 {
		got, err := s.rdb.ZRangeWithScores(ctx, keys[0], 0, int64(limit)).Result()
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("read %ss: %w", what, err)
		}
		for _, z := range got {
			zs = append(zs, deadline{keys[0], z})
		}
	} else {
		cmds := make([]*redis.ZSliceCmd, len(keys))
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, key := range keys {
				cmds[i] = p.ZRangeWithScores(ctx, key, 0, int64(limit))
			}
			return nil
		})
		for i, cmd := range cmds {
			got, err := cmd.Result()
			if err != nil {
				errs = append(errs, fmt.Errorf("read %ss (%s): %w", what, keys[i], err))
				continue
			}
			for _, z := range got {
				zs = append(zs, deadline{keys[i], z})
			}
		}
		if len(errs) == len(keys) {
			return nil, time.Time{}, errors.Join(errs...)
		}
		slices.SortStableFunc(zs, func(a, b deadline) int { return cmp.Compare(a.z.Score, b.z.Score) })
	}
	var due []R
	for _, d := range zs {
		at := time.UnixMilli(int64(d.z.Score))
		if at.After(now) {
			return due, at, errors.Join(errs...)
		}
		if len(due) == limit {
			return due, now, errors.Join(errs...)
		}
		m, _ := d.z.Member.(string)
		if r, ok := parse(m); ok {
			due = append(due, r)
		} else if err := s.rdb.ZRem(ctx, d.key, m).Err(); err != nil {
			return nil, time.Time{}, fmt.Errorf("drop bad %s %q: %w", what, m, err)
		}
	}
	return due, time.Time{}, errors.Join(errs...)
}

// ForgetProvisionDeadlines drops sessions from the deadline index (they left provisioning,
// or no longer exist).
func (s *Store) ForgetProvisionDeadlines(ctx context.Context, refs ...SessionRef) error {
	if len(refs) == 0 {
		return nil
	}
	if err := s.rdb.ZRem(ctx, provisionDeadlinesKey, refMembers(refs)...).Err(); err != nil {
		return fmt.Errorf("forget provisioning deadlines: %w", err)
	}
	return nil
}

// AddNodeSession records that the session is placed on node. Transition records it when it
// places a session; the placer's sweep calls it for a placement whose entry is missing.
func (s *Store) AddNodeSession(ctx context.Context, node string, r SessionRef) error {
	if err := s.rdb.SAdd(ctx, nodeSessionsKey(node), r.member()).Err(); err != nil {
		return fmt.Errorf("index session %s on node %s: %w", r.ID, node, err)
	}
	return nil
}

// NodeSessions answers the sessions recorded on node: every session placed there and not
// yet ended, and perhaps some that have (check each session's state and node).
func (s *Store) NodeSessions(ctx context.Context, node string) ([]SessionRef, error) {
	ms, err := s.rdb.SMembers(ctx, nodeSessionsKey(node)).Result()
	if err != nil {
		return nil, fmt.Errorf("sessions of node %s: %w", node, err)
	}
	out := make([]SessionRef, 0, len(ms))
	for _, m := range ms {
		if r, ok := parseRef(m); ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// ForgetNodeSessions drops sessions from node's index.
func (s *Store) ForgetNodeSessions(ctx context.Context, node string, refs ...SessionRef) error {
	if len(refs) == 0 {
		return nil
	}
	if err := s.rdb.SRem(ctx, nodeSessionsKey(node), refMembers(refs)...).Err(); err != nil {
		return fmt.Errorf("forget sessions of node %s: %w", node, err)
	}
	return nil
}

// createWrites is what a create's script is given for signal_created: the global keys
// (none on a Cluster) and the arguments.
type createWrites struct {
	keys []string
	args []any
}

// inScript reports whether the script signals the create (else afterCreate must).
func (w createWrites) inScript() bool { return len(w.keys) > 0 }

// createSignals answers signal_created's keys and arguments for sess: the writes of
// afterCreate, made by the create's script on one Redis; on a Cluster no keys (they are in
// other slots), and the caller calls afterCreate.
func (s *Store) createSignals(sess *session.Session) createWrites {
	deadline := ""
	if at, ok := s.provisionDeadline(sess); ok {
		deadline = strconv.FormatInt(at.UnixMilli(), 10)
	}
	w := createWrites{args: []any{sess.ProjectID, SessionRef{Project: sess.ProjectID, ID: sess.ID}.member(), deadline}}
	if s.oneRedis {
		w.keys = []string{pendingSignalKey, outboxSignalKey, provisionDeadlinesKey}
	}
	return w
}

// afterCreate signals the new session's work (placement, its pending event) and indexes its
// provisioning deadline, in one round trip after the create: on a Cluster, where the
// create's script cannot (signal_created).
func (s *Store) afterCreate(ctx context.Context, sess *session.Session) {
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		signal(ctx, p, WorkPending, sess.ProjectID)
		signal(ctx, p, WorkOutbox, sess.ProjectID)
		if at, ok := s.provisionDeadline(sess); ok {
			ref := SessionRef{Project: sess.ProjectID, ID: sess.ID}
			p.ZAddNX(ctx, provisionDeadlinesKey, redis.Z{Score: float64(at.UnixMilli()), Member: ref.member()})
		}
		return nil
	})
}

// SignalCreated signals sess's work as its create would have had its answer come back: on a
// Cluster, where the create's script cannot signal, its caller does so after the answer
// (afterCreate), and a create whose write went through unanswered, then sent again (go-redis
// retries it) and refused as existing, never did. Safe to repeat. On one Redis the script
// signalled.
func (s *Store) SignalCreated(ctx context.Context, sess *session.Session) {
	if !s.oneRedis {
		s.afterCreate(ctx, sess)
	}
}

// afterTransition keeps the global indexes after a transition out (c, out: the request and
// the session after it), in the round trip that signals the outbox. Failures are not the
// transition's: a stale entry is dropped by its reader. When the transition's script did
// that (inScript, on one Redis), what is left is to drop an ended session from its node's
// set, which the script could not name before it read the node. An ending also reads, in
// the same round trip, which retained sessions lapsed, and trims those (trimRetained).
func (s *Store) afterTransition(ctx context.Context, c Change, out *session.Session, inScript bool) {
	ref := SessionRef{Project: c.Project, ID: c.ID}
	if inScript && !c.To.Terminal() {
		return
	}
	provisioning := func(st session.State) bool { return st == session.Pending || st == session.Provisioning }
	now := s.now()
	var due *redis.StringSliceCmd
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if !inScript {
			signal(ctx, p, WorkOutbox, c.Project)
			if c.NodeID != "" && !c.To.Terminal() {
				p.SAdd(ctx, nodeSessionsKey(c.NodeID), ref.member())
			}
			if provisioning(c.From) && !provisioning(c.To) {
				p.ZRem(ctx, provisionDeadlinesKey, ref.member())
			}
		}
		if c.To.Terminal() {
			if out != nil && out.NodeID != "" {
				p.SRem(ctx, nodeSessionsKey(out.NodeID), ref.member())
			}
			due = dueRetained(ctx, p, c.Project, now)
		}
		return nil
	})
	if due != nil {
		_, _ = s.trimRetained(ctx, c.Project, due.Val(), now)
	}
}

// SnapshotProjects answers the projects that have snapshots (and perhaps some whose last
// snapshot was deleted: ForgetSnapshotProject drops those).
func (s *Store) SnapshotProjects(ctx context.Context) ([]string, error) {
	ps, err := s.rdb.SMembers(ctx, snapshotProjectsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("projects with snapshots: %w", err)
	}
	return ps, nil
}

// indexSnapshotProject records that project has snapshots; called after each snapshot is
// written (a crash between the two leaves the project out until the next full sweep:
// IndexSnapshotProjects).
func (s *Store) indexSnapshotProject(ctx context.Context, project string) error {
	if err := s.rdb.SAdd(ctx, snapshotProjectsKey, project).Err(); err != nil {
		return fmt.Errorf("index project %s as having snapshots: %w", project, err)
	}
	return nil
}

// ForgetSnapshotProject drops project from the projects with snapshots if it has none. It
// removes first and checks after, so a snapshot written meanwhile (written, then indexed)
// is either seen here and indexed again, or indexed after the removal.
func (s *Store) ForgetSnapshotProject(ctx context.Context, project string) error {
	if err := s.rdb.SRem(ctx, snapshotProjectsKey, project).Err(); err != nil {
		return fmt.Errorf("forget project %s's snapshots: %w", project, err)
	}
	n, err := s.rdb.HLen(ctx, ProjectKeys(project).objects(KindSnapshot)).Result()
	if err != nil {
		return fmt.Errorf("count project %s's snapshots: %w", project, err)
	}
	if n > 0 {
		return s.indexSnapshotProject(ctx, project)
	}
	return nil
}

// sweepBatch is how many projects a full sweep checks per round trip.
const sweepBatch = 500

// IndexSnapshotProjects records every one of projects that has snapshots (a full sweep:
// repairs an index write lost to a crash). One round trip per sweepBatch projects.
func (s *Store) IndexSnapshotProjects(ctx context.Context, projects []string) error {
	counts, err := s.countEach(ctx, projects, func(p redis.Pipeliner, project string) *redis.IntCmd {
		return p.HLen(ctx, ProjectKeys(project).objects(KindSnapshot))
	})
	if err != nil {
		return fmt.Errorf("count snapshots: %w", err)
	}
	var has []any
	for i, n := range counts {
		if n > 0 {
			has = append(has, projects[i])
		}
	}
	if len(has) == 0 {
		return nil
	}
	return s.rdb.SAdd(ctx, snapshotProjectsKey, has...).Err()
}

// ActiveProjects answers the projects, of projects, that have sessions holding a
// concurrency slot (pending to stopping): the only ones a full sweep of the placer visits.
// One round trip per sweepBatch projects.
func (s *Store) ActiveProjects(ctx context.Context, projects []string) ([]string, error) {
	counts, err := s.countEach(ctx, projects, func(p redis.Pipeliner, project string) *redis.IntCmd {
		return p.SCard(ctx, ProjectKeys(project).active())
	})
	if err != nil {
		return nil, fmt.Errorf("find projects with sessions: %w", err)
	}
	var out []string
	for i, n := range counts {
		if n > 0 {
			out = append(out, projects[i])
		}
	}
	return out, nil
}

// countEach runs one counting command per project, pipelined in batches.
func (s *Store) countEach(ctx context.Context, projects []string, count func(redis.Pipeliner, string) *redis.IntCmd) ([]int64, error) {
	out := make([]int64, 0, len(projects))
	for start := 0; start < len(projects); start += sweepBatch {
		batch := projects[start:min(start+sweepBatch, len(projects))]
		cmds := make([]*redis.IntCmd, len(batch))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, project := range batch {
				cmds[i] = count(p, project)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		for _, c := range cmds {
			out = append(out, c.Val())
		}
	}
	return out, nil
}
