package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// warningScript sets idle_warn or life_warn once and appends the warning event.
// KEYS: session hash, outbox. ARGV: field, at ms, event field/value args.
var warningScript = redis.NewScript(`
local cur = redis.call('HMGET', KEYS[1], 'state', ARGV[1])
if not cur[1] then return 0 end
if cur[2] and cur[2] ~= '' then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local e = {}
for i = 3, #ARGV do e[#e + 1] = ARGV[i] end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do e[#e + 1] = 'h.' .. all[i]; e[#e + 1] = all[i + 1] end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ` + outboxMaxLenLua + `, '*', unpack(e))
return 1
`)

// MarkWarning records an idle or lifetime warning (session.EventIdleWarning or
// session.EventLifetimeWarning) on the session and in the outbox, once per timer arm.
func (s *Store) MarkWarning(ctx context.Context, project, id, eventType string, at time.Time) error {
	field := "idle_warn"
	if eventType == session.EventLifetimeWarning {
		field = "life_warn"
	} else if eventType != session.EventIdleWarning {
		return &session.FieldError{Field: "type", Message: "not a warning event: " + eventType}
	}
	args := []any{field, at.UnixMilli(), "id", session.NewID("evt_", at), "type", eventType,
		"session_id", id, "project_id", project, "at", at.UnixMilli()}
	if err := warningScript.Run(ctx, s.rdb, []string{ProjectKeys(project).session(id), Outbox(project)}, args...).Err(); err != nil {
		return fmt.Errorf("mark %s %s: %w", eventType, id, err)
	}
	s.signalAfter(ctx, project, WorkOutbox)
	return nil
}

// ClearIdleWarning re-arms the idle warning after activity.
func (s *Store) ClearIdleWarning(ctx context.Context, project, id string) error {
	return s.rdb.HDel(ctx, ProjectKeys(project).session(id), "idle_warn").Err()
}
