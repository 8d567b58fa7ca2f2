package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// A run is a JSON document under a key of its own (ProjectKeys.run) that expires the store's
// retention after its last write, as an ended session does: a run keeps up to MaxOutputBytes
// of each stream, and a project that loops runs must not fill, for ever, the Redis that every
// project shares. There is no list of runs to index.
//
// The record also names the attempt that made it (owner, never shown by the API): with an
// Idempotency-Key, every request that holds the key in turn works on the same run id, and
// CreateRun lets exactly one of them make the record, and so run the command.
//
// Each attempt holds a work lease (SetRunWork, before it creates the record) that its gateway
// renews until the run has ended. A gateway that stops first leaves the run queued or running;
// once its lease runs out, another gateway's recovery claims it and, when the attempt owns the
// run and it has not ended, records it failed (FailRun). The owner's move from queued to
// running (StartRun), its end (FinishRun) and the recovery's move to failed all compare the
// state: whichever comes second finds the other's, so a run that a recovery failed never
// starts its command, and a run ends once, with one run.finished (that of the write that
// ended it), even when its gateway was cut off from Redis rather than dead and comes back.

// storedRun is a run as stored: the API object and the attempt that owns it.
type storedRun struct {
	*session.Run
	Owner string `json:"owner,omitempty"`
}

func encodeRun(run *session.Run, owner string) ([]byte, error) {
	b, err := json.Marshal(storedRun{Run: run, Owner: owner})
	if err != nil {
		return nil, fmt.Errorf("encode run %s: %w", run.ID, err)
	}
	return b, nil
}

// CreateRun writes a new run, owned by the attempt owner, unless one with its id exists
// already: false then, and that one is left as it is. Of the requests that share a run id
// (those that hold one Idempotency-Key in turn) only the one that created the record runs
// the command; the others answer the record.
func (s *Store) CreateRun(ctx context.Context, project string, run *session.Run, owner string) (bool, error) {
	b, err := encodeRun(run, owner)
	if err != nil {
		return false, err
	}
	created, err := s.rdb.SetNX(ctx, ProjectKeys(project).run(run.ID), b, s.retention).Result()
	if err != nil {
		return false, fmt.Errorf("create run %s: %w", run.ID, err)
	}
	return created, nil
}

// PutRun writes (or overwrites) a run, readable for the retention from now.
func (s *Store) PutRun(ctx context.Context, project string, run *session.Run) error {
	b, err := encodeRun(run, "")
	if err != nil {
		return err
	}
	if err := s.rdb.Set(ctx, ProjectKeys(project).run(run.ID), b, s.retention).Err(); err != nil {
		return fmt.Errorf("put run %s: %w", run.ID, err)
	}
	return nil
}

// GetRun reads a run, or answers ErrNotFound (never written, or past its retention).
func (s *Store) GetRun(ctx context.Context, project, id string) (*session.Run, error) {
	run, _, err := s.GetRunOwner(ctx, project, id)
	return run, err
}

// GetRunOwner is GetRun that also answers the attempt that owns the run ("" for one written
// by PutRun, or before owners were recorded).
func (s *Store) GetRunOwner(ctx context.Context, project, id string) (*session.Run, string, error) {
	key := ProjectKeys(project).run(id)
	b, err := s.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		run, lerr := s.getLegacyRun(ctx, project, id) // saved before runs had keys of their own
		if !errors.Is(lerr, ErrNotFound) {
			return run, "", lerr
		}
		// Not in the legacy hash either: the migration (or another read) may have moved it
		// between the two reads, to where the first looked.
		if b, err = s.rdb.Get(ctx, key).Bytes(); errors.Is(err, redis.Nil) {
			return nil, "", ErrNotFound
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("get run %s: %w", id, err)
	}
	rec := storedRun{Run: &session.Run{}}
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, "", fmt.Errorf("decode run %s: %w", id, err)
	}
	return rec.Run, rec.Owner, nil
}

// runWriteScript writes a run that an attempt owns, with its event when given.
//
// KEYS: the run, the project's outbox, then ProjectKeys.keptKeys
// ARGV: op (start | fail | finish), owner, the run's JSON, retention ms, the state the run must
// be in (start, fail), the run without its output (empty: its output does not count against
// the budget), now ms, the budget, then the event's fields (none: no event)
//
// start and fail write only a run that owner owns, in that state; finish only one that owner
// owns and that has not ended (a recovery's end stands: its run.finished went out, and a
// run's end is announced once), or one that is gone (its record expired or was lost: nothing
// announced its end). Answers OK, or why not: GONE (no run), BAD (not JSON), OWNER
// (another's), STATE (in another state; for finish, ended).
var runWriteScript = redis.NewScript(keepLua + `
local raw = redis.call('GET', KEYS[1])
if raw or ARGV[1] ~= 'finish' then
  if not raw then return 'GONE' end
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' then return 'BAD' end
  if rec.owner ~= ARGV[2] then return 'OWNER' end
  if ARGV[1] == 'finish' then
    if rec.state == '` + session.RunSucceeded + `' or rec.state == '` + session.RunFailed + `' then return 'STATE' end
  elseif rec.state ~= ARGV[5] then
    return 'STATE'
  end
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
if ARGV[6] ~= '' then
  keep(3, KEYS[1], #ARGV[3], ARGV[6], tonumber(ARGV[7]) + tonumber(ARGV[4]), ARGV[7], tonumber(ARGV[8]))
end
if #ARGV > 8 then
  local e = {}
  for i = 9, #ARGV do e[#e + 1] = ARGV[i] end
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', unpack(e))
end
return 'OK'
`)

// writeRun runs runWriteScript; event (nil: none) is appended as typ's data.object. With a
// budget (> 0), a run's output of keptOutputMin or more counts against it.
func (s *Store) writeRun(ctx context.Context, op, project string, run *session.Run, owner, from, typ string, event any, budget int64) (bool, error) {
	b, err := encodeRun(run, owner)
	if err != nil {
		return false, err
	}
	var stub []byte
	if budget > 0 && len(run.Stdout)+len(run.Stderr) >= keptOutputMin {
		cut := *run
		cut.StdoutBytes, cut.StderrBytes = max(cut.StdoutBytes, int64(len(cut.Stdout))), max(cut.StderrBytes, int64(len(cut.Stderr)))
		cut.Stdout, cut.Stderr, cut.Truncated, cut.OutputExpired = "", "", true, true
		if stub, err = encodeRun(&cut, owner); err != nil {
			return false, err
		}
	}
	k := ProjectKeys(project)
	args := []any{op, owner, b, s.retention.Milliseconds(), from, stub, s.now().UnixMilli(), budget}
	if event != nil {
		sessionID := ""
		if run.SessionID != nil {
			sessionID = *run.SessionID
		}
		_, values, err := s.eventValues(project, "", time.Time{}, typ, sessionID, event)
		if err != nil {
			return false, err
		}
		args = append(args, values...)
	}
	res, err := runWriteScript.Run(ctx, s.rdb, append([]string{k.run(run.ID), k.Outbox()}, k.keptKeys()...), args...).Text()
	if err != nil {
		return false, fmt.Errorf("%s run %s: %w", op, run.ID, err)
	}
	switch res {
	case "OK":
		if event != nil {
			s.signalAfter(ctx, project, WorkOutbox)
		}
		return true, nil
	case "BAD":
		return false, fmt.Errorf("%s run %s: its record is not JSON", op, run.ID)
	}
	return false, nil
}

// StartRun writes run (running, about to start its command) if owner owns it and it is still
// queued; false when not: a recovery ended it (owner's lease ran out), and the command must
// not start.
func (s *Store) StartRun(ctx context.Context, project string, run *session.Run, owner string) (bool, error) {
	return s.writeRun(ctx, "start", project, run, owner, session.RunQueued, "", nil, 0)
}

// FinishRun writes run as it ended, by owner, and appends its run.finished event (event, the
// run as webhooks carry it) with it: the two never disagree. With budget (> 0, bytes) its
// output counts against the project's budget of stored output (kept.go), which may drop the
// output of others, or, past it alone, its own. False, and nothing written, when the run has
// ended already (a recovery recorded it failed while owner's gateway was cut off from Redis:
// that end was announced, and stands) or is another attempt's.
func (s *Store) FinishRun(ctx context.Context, project string, run *session.Run, owner string, event *session.Run, budget int64) (bool, error) {
	return s.writeRun(ctx, "finish", project, run, owner, "", session.EventRunFinished, event, budget)
}

// FailRun writes run (failed by a recovery) and appends its run.finished event, if owner owns
// it and it is still in state from; false when not (it moved on, or is another attempt's).
func (s *Store) FailRun(ctx context.Context, project string, run *session.Run, owner, from string, event *session.Run) (bool, error) {
	return s.writeRun(ctx, "fail", project, run, owner, from, session.EventRunFinished, event, 0)
}

// RunRef names one attempt at a run: a request's, which holds a work lease on it until the
// run has ended.
type RunRef struct{ Project, ID, Attempt string }

// member is the lease's member: "PROJECT/RUN/ATTEMPT" (no id holds a "/").
func (r RunRef) member() string { return r.Project + "/" + r.ID + "/" + r.Attempt }

func parseRunRef(m string) (RunRef, bool) {
	parts := strings.Split(m, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return RunRef{}, false
	}
	return RunRef{parts[0], parts[1], parts[2]}, true
}

// runLeases is the runs' lease set, written in its shards: a set is of a new attempt, which
// no other lease holds, and no older gateway ensures or sets a lease on another's attempt.
var runLeases = newShardedLeases("runs", "run", runWorkKey, runWorkerKey, false, true)

func (s *Store) runWork(ctx context.Context, op string, ref RunRef, token string, until, now time.Time) (bool, error) {
	return s.shardedLease(ctx, runLeases, op, ref.member(), ref.ID, token, until, now)
}

// SetRunWork gives the attempt ref a lease on its run until until, held by ref.Attempt.
func (s *Store) SetRunWork(ctx context.Context, ref RunRef, until time.Time) error {
	_, err := s.runWork(ctx, "set", ref, ref.Attempt, until, until)
	return err
}

// RenewRunWork extends the attempt's lease to until; false when the attempt no longer holds
// it (a recovery claimed it).
func (s *Store) RenewRunWork(ctx context.Context, ref RunRef, until time.Time) (bool, error) {
	return s.runWork(ctx, "renew", ref, ref.Attempt, until, until)
}

// ReleaseRunWork ends the lease that token holds on the attempt (the attempt's own, or a
// recovery's); false when token no longer held it.
func (s *Store) ReleaseRunWork(ctx context.Context, ref RunRef, token string) (bool, error) {
	return s.runWork(ctx, "release", ref, token, time.Time{}, time.Time{})
}

// ClaimRunWork gives the attempt's lease to token until until if it ended at or before now;
// false when it still runs, or there is none.
func (s *Store) ClaimRunWork(ctx context.Context, ref RunRef, token string, now, until time.Time) (bool, error) {
	return s.runWork(ctx, "claim", ref, token, until, now)
}

// DueRunWork answers up to limit attempts whose lease ended at or before now, earliest
// first, from every shard of the lease set and from the set of before the shards (older
// gateways' attempts, during a rolling deploy), and when the next lease after them ends
// (zero: none; now: more are due). One pass reads at most limit+1 leases of each set.
func (s *Store) DueRunWork(ctx context.Context, now time.Time, limit int) ([]RunRef, time.Time, error) {
	return dueDeadlinesIn(ctx, s, runLeases.allEnds(), "run lease", now, limit, parseRunRef)
}
