package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// timersScript sets a live session's timers when its version still matches.
// KEYS: session hash, outbox. ARGV: version, idle_s, life_s, expires ms (0 = not running yet),
// event field/value args.
var timersScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', 'ver')
if not cur[1] then return {'NOTFOUND'} end
if cur[2] ~= ARGV[1] then return {'CONFLICT', cur[1], cur[2]} end
if cur[1] == 'stopped' or cur[1] == 'failed' or cur[1] == 'expired' then return {'CONFLICT', cur[1], cur[2]} end
local ver = tostring(tonumber(cur[2]) + 1)
redis.call('HSET', KEYS[1], 'ver', ver, 'idle_s', ARGV[2], 'life_s', ARGV[3])
if ARGV[4] ~= '0' then redis.call('HSET', KEYS[1], 'expires', ARGV[4], 'life_warn', '') end
local e = {}
for i = 5, #ARGV do e[#e + 1] = ARGV[i] end
e[#e + 1] = 'version'
e[#e + 1] = ver
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', unpack(e))
return redis.call('HGETALL', KEYS[1])
`)

// EventTimersChanged is the internal outbox event of a PATCH: nodes re-arm their timers.
const EventTimersChanged = "session.timers_changed"

// SetTimers writes new timers on a session that is still at version s.Version, as
// session.ApplyPatch computed them.
func (s *Store) SetTimers(ctx context.Context, sess *session.Session) (*session.Session, error) {
	var exp int64
	if sess.ExpiresAt != nil {
		exp = sess.ExpiresAt.UnixMilli()
	}
	now := s.now().UnixMilli()
	args := []any{sess.Version, sess.IdleTimeoutS, sess.MaxLifetimeS, exp,
		"id", session.NewID("evt_", s.now()), "type", EventTimersChanged, "session_id", sess.ID,
		"project_id", sess.ProjectID, "at", now}
	res, err := timersScript.Run(ctx, s.rdb, []string{ProjectKeys(sess.ProjectID).session(sess.ID), Outbox(sess.ProjectID)}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("set timers %s: %w", sess.ID, err)
	}
	switch res[0] {
	case "NOTFOUND":
		return nil, ErrNotFound
	case "CONFLICT":
		v, _ := strconv.ParseInt(res[2], 10, 64)
		return nil, &ConflictError{Current: session.State(res[1]), Version: v}
	}
	s.signalAfter(ctx, sess.ProjectID, WorkOutbox)
	m := make(map[string]string, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		m[res[i]] = res[i+1]
	}
	return decode(m)
}

var touchScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'activity', ARGV[1]) end
return 1
`)

// Touch records activity on a session (it resets the idle timer); a missing session is left
// missing.
func (s *Store) Touch(ctx context.Context, project, id string) error {
	return touchScript.Run(ctx, s.rdb, []string{ProjectKeys(project).session(id)}, s.now().UnixMilli()).Err()
}
