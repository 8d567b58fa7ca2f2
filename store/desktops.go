package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/desktop"
	"wb/session"
)

// Desktops are records (desktop.Record as JSON) in one hash each, written only through
// compare-and-set scripts on their version that append the event of any change of state to
// the project's outbox in the same step, so webhooks deliver every transition.

// ErrDesktopChanged: the desktop is not at the version the caller read (another writer won).
var ErrDesktopChanged = errors.New("the desktop changed concurrently")

// DesktopUsedError: PutDesktopIfUnused found a use at or after its bound (a use records no
// version: see desktopTouchScript). At is that use.
type DesktopUsedError struct{ At time.Time }

func (e *DesktopUsedError) Error() string {
	return fmt.Sprintf("the desktop was used at %s", e.At.UTC().Format(time.RFC3339Nano))
}

// desktopPutScript writes a desktop record if its version is the expected one (0: it must
// not exist, and, when ARGV[11] is given, the project must have fewer desktops than that) and,
// when ARGV[10] is given, it was not used since then (ms); it indexes it, and appends the
// event (when given) carrying the record. The count and the write are one step, so creates
// at once, through any gateway, cannot pass the most together.
//
// KEYS: desktop hash, desktops index, outbox
// ARGV: id, expected version, doc, state, event type ("" for none), event id, now ms, object,
// project, unused since ms ("" for no bound), most desktops of a new one's project ("" for no
// bound)
var desktopPutScript = redis.NewScript(`
local ver = redis.call('HGET', KEYS[1], 'ver')
if ARGV[2] == '0' then
  if ver then return {'CONFLICT', ver} end
  if ARGV[11] ~= '' and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[11]) then return {'FULL'} end
  ver = '0'
elseif not ver then
  return {'NOTFOUND'}
elseif ver ~= ARGV[2] then
  return {'CONFLICT', ver}
end
if ARGV[10] ~= '' then
  local used = redis.call('HGET', KEYS[1], 'used')
  if used and tonumber(used) >= tonumber(ARGV[10]) then return {'USED', used} end
end
local nv = tostring(tonumber(ver) + 1)
redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'state', ARGV[4], 'ver', nv)
redis.call('ZADD', KEYS[2], 0, ARGV[1])
if ARGV[5] ~= '' then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', 'id', ARGV[6], 'type', ARGV[5],
    'session_id', ARGV[1], 'project_id', ARGV[9], 'at', ARGV[7], 'object', ARGV[8])
end
return {'OK', nv, redis.call('HGET', KEYS[1], 'used') or ''}
`)

// desktopDeleteScript removes a desktop and appends desktop.deleted with its last record.
//
// KEYS: desktop hash, desktops index, outbox
// ARGV: id, event id, now ms, project
var desktopDeleteScript = redis.NewScript(`
local doc = redis.call('HGET', KEYS[1], 'doc')
if not doc then return {'NOTFOUND'} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', 'id', ARGV[2], 'type', '` + desktop.EventDeleted + `',
  'session_id', ARGV[1], 'project_id', ARGV[4], 'at', ARGV[3], 'object', doc)
return {'OK', doc}
`)

// desktopTouchScript records a use of an awake desktop; it answers the record's state.
//
// KEYS: desktop hash; ARGV: now ms
var desktopTouchScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'NOTFOUND' end
if st == 'starting' or st == 'running' then redis.call('HSET', KEYS[1], 'used', ARGV[1]) end
return st
`)

// PutDesktop writes r if the stored record is at r.Version (0: a new desktop), and appends
// the event of its state when it differs from prev (prev "" for a new desktop; the same state
// writes no event). It answers r at its new version; ErrDesktopChanged when another write
// came first, ErrNotFound when the desktop is gone.
func (s *Store) PutDesktop(ctx context.Context, r desktop.Record, prev desktop.State) (desktop.Record, error) {
	return s.putDesktop(ctx, r, prev, "", "")
}

// CreateDesktop writes the new desktop r (at version 0) as PutDesktop does, unless its
// project has max desktops already, in any state: then it answers a *ConflictError saying
// so, and writes nothing.
func (s *Store) CreateDesktop(ctx context.Context, r desktop.Record, max int) (desktop.Record, error) {
	out, err := s.putDesktop(ctx, r, "", "", strconv.Itoa(max))
	if errors.Is(err, errDesktopsFull) {
		return r, &ConflictError{Message: fmt.Sprintf(
			"the project already has %d desktops, the most it may have (failed and stopped ones count); delete one (DELETE /v1/desktops/{id})", max)}
	}
	return out, err
}

// errDesktopsFull: desktopPutScript found the project at its most desktops.
var errDesktopsFull = errors.New("the project has its most desktops")

// PutDesktopIfUnused is PutDesktop that also refuses, with a *DesktopUsedError, when the
// desktop was used at or after unusedSince: an idle desktop is put to sleep only if no use
// came between the read that found it idle and the write (a tool call that began meanwhile).
func (s *Store) PutDesktopIfUnused(ctx context.Context, r desktop.Record, prev desktop.State, unusedSince time.Time) (desktop.Record, error) {
	return s.putDesktop(ctx, r, prev, strconv.FormatInt(unusedSince.UnixMilli(), 10), "")
}

func (s *Store) putDesktop(ctx context.Context, r desktop.Record, prev desktop.State, unusedSince, maxDesktops string) (desktop.Record, error) {
	now := s.now()
	r.UpdatedAt = *session.At(now)
	doc, err := json.Marshal(r)
	if err != nil {
		return r, fmt.Errorf("encode desktop %s: %w", r.ID, err)
	}
	typ, obj := "", []byte{}
	if r.State != prev {
		typ = desktop.EventType(r.State)
		if obj, err = json.Marshal(r.Public()); err != nil {
			return r, fmt.Errorf("encode desktop %s: %w", r.ID, err)
		}
	}
	k := ProjectKeys(r.ProjectID)
	res, err := desktopPutScript.Run(ctx, s.rdb, []string{k.desktop(r.ID), k.desktops(), Outbox(r.ProjectID)},
		r.ID, r.Version, doc, string(r.State), typ, session.NewID("evt_", now), now.UnixMilli(), obj, r.ProjectID, unusedSince, maxDesktops).StringSlice()
	if err != nil {
		return r, fmt.Errorf("put desktop %s: %w", r.ID, err)
	}
	switch res[0] {
	case "NOTFOUND":
		return r, ErrNotFound
	case "CONFLICT":
		return r, ErrDesktopChanged
	case "FULL":
		return r, errDesktopsFull
	case "USED":
		used, _ := strconv.ParseInt(res[1], 10, 64)
		return r, &DesktopUsedError{At: time.UnixMilli(used)}
	}
	r.Version, _ = strconv.ParseInt(res[1], 10, 64)
	if used, _ := strconv.ParseInt(res[2], 10, 64); used > 0 {
		r.LastUsedAt = session.AtMillis(used)
	}
	if typ != "" {
		s.signalAfter(ctx, r.ProjectID, WorkOutbox)
	}
	return r, nil
}

// GetDesktop answers the project's desktop, or ErrNotFound.
func (s *Store) GetDesktop(ctx context.Context, project, id string) (desktop.Record, error) {
	vals, err := s.rdb.HMGet(ctx, ProjectKeys(project).desktop(id), "doc", "ver", "used").Result()
	if err != nil {
		return desktop.Record{}, fmt.Errorf("get desktop %s: %w", id, err)
	}
	return decodeDesktop(id, vals)
}

func decodeDesktop(id string, vals []any) (desktop.Record, error) {
	var r desktop.Record
	doc, _ := vals[0].(string)
	if doc == "" {
		return r, ErrNotFound
	}
	if err := json.Unmarshal([]byte(doc), &r); err != nil {
		return r, fmt.Errorf("decode desktop %s: %w", id, err)
	}
	ver, _ := vals[1].(string)
	r.Version, _ = strconv.ParseInt(ver, 10, 64)
	if used, _ := vals[2].(string); used != "" {
		if ms, _ := strconv.ParseInt(used, 10, 64); ms > 0 {
			r.LastUsedAt = session.AtMillis(ms)
		}
	}
	r.Object = desktop.ObjectName
	return r, nil
}

// ListDesktops answers up to limit of the project's desktops, newest first, after cursor,
// and the cursor of the next page ("" when none).
func (s *Store) ListDesktops(ctx context.Context, project string, limit int, cursor string) ([]desktop.Record, string, error) {
	if limit == 0 {
		limit = 10
	}
	if limit < 1 || limit > MaxListLimit {
		return nil, "", &session.FieldError{Field: "limit", Message: fmt.Sprintf("must be 1–%d, got %d", MaxListLimit, limit)}
	}
	max := "+"
	if cursor != "" {
		if !strings.HasPrefix(cursor, desktop.IDPrefix) || !validCursor(cursor) {
			return nil, "", &session.FieldError{Field: "cursor", Message: "not a cursor this API returned"}
		}
		max = "(" + cursor
	}
	k := ProjectKeys(project)
	ids, err := s.rdb.ZRevRangeByLex(ctx, k.desktops(), &redis.ZRangeBy{Max: max, Min: "-", Count: int64(limit + 1)}).Result()
	if err != nil {
		return nil, "", fmt.Errorf("list desktops: %w", err)
	}
	next := ""
	if len(ids) > limit {
		ids = ids[:limit]
		next = ids[limit-1]
	}
	cmds := make([]*redis.SliceCmd, len(ids))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HMGet(ctx, k.desktop(id), "doc", "ver", "used")
		}
		return nil
	}); err != nil {
		return nil, "", fmt.Errorf("list desktops: %w", err)
	}
	out := make([]desktop.Record, 0, len(ids))
	for i, c := range cmds {
		r, err := decodeDesktop(ids[i], c.Val())
		if errors.Is(err, ErrNotFound) {
			continue // deleted between the index and the read
		}
		if err != nil {
			return nil, "", err
		}
		out = append(out, r)
	}
	return out, next, nil
}

// DeleteDesktop removes the desktop and its idle deadline, appends desktop.deleted, and
// answers the record as it was (to clean up what lay behind it); ErrNotFound if none.
func (s *Store) DeleteDesktop(ctx context.Context, project, id string) (desktop.Record, error) {
	now := s.now()
	k := ProjectKeys(project)
	res, err := desktopDeleteScript.Run(ctx, s.rdb, []string{k.desktop(id), k.desktops(), Outbox(project)},
		id, session.NewID("evt_", now), now.UnixMilli(), project).StringSlice()
	if err != nil {
		return desktop.Record{}, fmt.Errorf("delete desktop %s: %w", id, err)
	}
	if res[0] == "NOTFOUND" {
		return desktop.Record{}, ErrNotFound
	}
	var r desktop.Record
	if err := json.Unmarshal([]byte(res[1]), &r); err != nil {
		return r, fmt.Errorf("decode desktop %s: %w", id, err)
	}
	s.signalAfter(ctx, project, WorkOutbox)
	if err := s.rdb.ZRem(ctx, desktopIdleKey, DesktopRef{project, id}.member()).Err(); err != nil {
		return r, fmt.Errorf("forget idle deadline of desktop %s: %w", id, err)
	}
	return r, nil
}

// TouchDesktop records a use of the desktop at now, if it is awake (starting or running),
// and answers its state; ErrNotFound if there is no such desktop.
func (s *Store) TouchDesktop(ctx context.Context, project, id string, now time.Time) (desktop.State, error) {
	st, err := desktopTouchScript.Run(ctx, s.rdb, []string{ProjectKeys(project).desktop(id)}, now.UnixMilli()).Text()
	if err != nil {
		return "", fmt.Errorf("touch desktop %s: %w", id, err)
	}
	if st == "NOTFOUND" {
		return "", ErrNotFound
	}
	return desktop.State(st), nil
}

// DesktopRef names one desktop of one project.
type DesktopRef struct{ Project, ID string }

func (r DesktopRef) member() string { return r.Project + "/" + r.ID }

// SetDesktopIdle records when the desktop falls idle (its last use plus the idle time).
func (s *Store) SetDesktopIdle(ctx context.Context, project, id string, at time.Time) error {
	m := DesktopRef{project, id}.member()
	if err := s.rdb.ZAdd(ctx, desktopIdleKey, redis.Z{Score: float64(at.UnixMilli()), Member: m}).Err(); err != nil {
		return fmt.Errorf("set idle deadline of desktop %s: %w", id, err)
	}
	return nil
}

// ForgetDesktopIdle drops the desktop's idle deadline (it is no longer awake) if it falls at
// or before due, the deadline the caller found passed: a later one was set by a use or a wake
// since, and is the desktop's again (a late forget of the old one would leave a woken desktop
// awake for good).
func (s *Store) ForgetDesktopIdle(ctx context.Context, project, id string, due time.Time) error {
	if err := forgetDeadlineScript.Run(ctx, s.rdb, []string{desktopIdleKey}, DesktopRef{project, id}.member(), due.UnixMilli()).Err(); err != nil {
		return fmt.Errorf("forget idle deadline of desktop %s: %w", id, err)
	}
	return nil
}

// forgetDeadlineScript removes a member of a deadline zset if its score is at most a time.
// KEYS: the zset. ARGV: member, time ms.
var forgetDeadlineScript = redis.NewScript(`
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and tonumber(at) <= tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
`)

// DueDesktopIdle answers up to limit desktops whose idle deadline is at or before now,
// earliest first, and when the next deadline after them falls (zero: none; now: more than
// limit are due).
func (s *Store) DueDesktopIdle(ctx context.Context, now time.Time, limit int) ([]DesktopRef, time.Time, error) {
	return dueDeadlines(ctx, s, desktopIdleKey, "desktop idle deadline", now, limit, parseDesktopRef)
}

func parseDesktopRef(m string) (DesktopRef, bool) {
	p, id, ok := strings.Cut(m, "/")
	return DesktopRef{p, id}, ok && p != "" && id != ""
}

// Leases on a desktop's transition: the gateway that starts the work of a starting or
// stopping desktop holds a lease (a token and an end time) and renews it while it works; when
// the lease ends unrenewed (that gateway died) another gateway claims it and resumes the work.

// desktopLeaseSet is the desktops' lease set, written in its shards when inShards (the
// store's: writeDesktopAndSnapshotLeasesInShards).
func desktopLeaseSet(inShards bool) shardedLeases {
	return newShardedLeases("desktops", "desktop", desktopWorkKey, desktopWorkerKey, true, inShards)
}

func (s *Store) desktopWork(ctx context.Context, op string, ref DesktopRef, token string, until, now time.Time) (bool, error) {
	return s.shardedLease(ctx, s.desktopLeases, op, ref.member(), ref.ID, token, until, now)
}

// SetDesktopWork gives the desktop's transition to the lease token until until, whoever held
// it before (the work of a newer request supersedes the older).
func (s *Store) SetDesktopWork(ctx context.Context, ref DesktopRef, token string, until time.Time) error {
	_, err := s.desktopWork(ctx, "set", ref, token, until, until)
	return err
}

// RenewDesktopWork extends lease token to until, taking it if it has no holder (the one
// EnsureDesktopWork set ahead of the work, whose SetDesktopWork failed); false when another
// token holds it.
func (s *Store) RenewDesktopWork(ctx context.Context, ref DesktopRef, token string, until time.Time) (bool, error) {
	return s.desktopWork(ctx, "keep", ref, token, until, until)
}

// EnsureDesktopWork gives the desktop a lease that ends at until, held by nobody, unless it
// has one: set before the desktop enters starting or stopping, it lets a recovery resume the
// transition once until passes should the gateway die before it takes its own lease
// (SetDesktopWork). It answers whether it set one.
func (s *Store) EnsureDesktopWork(ctx context.Context, ref DesktopRef, until time.Time) (bool, error) {
	return s.desktopWork(ctx, "ensure", ref, "", until, until)
}

// ReleaseDesktopWork ends lease token (the work is done); false when token no longer held it.
func (s *Store) ReleaseDesktopWork(ctx context.Context, ref DesktopRef, token string) (bool, error) {
	return s.desktopWork(ctx, "release", ref, token, time.Time{}, time.Time{})
}

// ClaimDesktopWork gives the desktop's transition to token until until if its lease ended at
// or before now; false when another holder's lease still runs or there is none.
func (s *Store) ClaimDesktopWork(ctx context.Context, ref DesktopRef, token string, now, until time.Time) (bool, error) {
	return s.desktopWork(ctx, "claim", ref, token, until, now)
}

// DueDesktopWork answers up to limit desktops whose work lease ended at or before now,
// earliest first, from every shard and the legacy pair (an older gateway's, during a rolling
// deploy), and when the next lease after them ends (zero: none; now: more are due).
func (s *Store) DueDesktopWork(ctx context.Context, now time.Time, limit int) ([]DesktopRef, time.Time, error) {
	return dueDeadlinesIn(ctx, s, s.desktopLeases.allEnds(), "desktop work lease", now, limit, parseDesktopRef)
}

// desktopSweepScript gives the turn to walk every desktop (KEYS[1]) to token ARGV[1] for
// ARGV[2] ms if nobody has it, or extends token's own; it answers 0, or the ms left of another
// holder's turn.
var desktopSweepScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return math.max(redis.call('PTTL', KEYS[1]), 1) end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 0
`)

// TakeDesktopSweep takes the turn to walk every desktop for period, or extends token's own
// turn to period from now. When another gateway has the turn, it answers false and how long
// that turn has left.
func (s *Store) TakeDesktopSweep(ctx context.Context, token string, period time.Duration) (bool, time.Duration, error) {
	left, err := desktopSweepScript.Run(ctx, s.rdb, []string{desktopSweepKey}, token, max(period.Milliseconds(), 1)).Int64()
	if err != nil {
		return false, 0, fmt.Errorf("take the turn of the desktop sweep: %w", err)
	}
	return left == 0, time.Duration(left) * time.Millisecond, nil
}
