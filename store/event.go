package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Event is one outbox entry: a transition, with the session as it was right after it.
type Event struct {
	StreamID  string // the Redis stream entry id
	ID        string // evt_…, stable across redeliveries
	Type      string
	SessionID string
	ProjectID string
	From, To  session.State
	Driver    session.Driver
	Reason    session.Reason
	Rule      string
	AtMs      int64
	Version   int64
	// Session is set for session events; Object for the others (snapshot.ready, run.finished,
	// quota.exceeded), as the JSON of data.object.
	Session *session.Session
	Object  json.RawMessage
}

// AppendEvent writes a non-transition event (snapshot.ready, run.finished, quota.exceeded,
// the timer warnings) to the project's outbox. sessionID orders it with that session's events
// ("" for project-wide events); object becomes data.object.
func (s *Store) AppendEvent(ctx context.Context, project, typ, sessionID string, object any) (string, error) {
	return s.AppendEventID(ctx, project, "", time.Time{}, typ, sessionID, object)
}

// AppendEventID is AppendEvent with the event's id and time (its created_at) given (empty,
// zero: a new one, now): an event that may be sent twice (quota.exceeded, by a decision taken
// again when its end was not recorded) has an id and a time derived from what it announces,
// the same each time, so that its receivers deduplicate it by id (the webhook-id header) as
// they do a redelivery, and the one they keep is the one they would have had.
func (s *Store) AppendEventID(ctx context.Context, project, id string, at time.Time, typ, sessionID string, object any) (string, error) {
	id, values, err := s.eventValues(project, id, at, typ, sessionID, object)
	if err != nil {
		return "", err
	}
	err = s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: Outbox(project), MaxLen: outboxMaxLen, Approx: true, Values: values}).Err()
	if err != nil {
		return "", fmt.Errorf("append %s event: %w", typ, err)
	}
	s.signalAfter(ctx, project, WorkOutbox)
	return id, nil
}

// eventValues answers an event's id (id, or a new one if empty) and its outbox entry's
// fields, at (zero: now) its time, for AppendEvent and for scripts that append an event with
// the write it announces.
func (s *Store) eventValues(project, id string, at time.Time, typ, sessionID string, object any) (string, []any, error) {
	b, err := json.Marshal(object)
	if err != nil {
		return "", nil, fmt.Errorf("encode %s event: %w", typ, err)
	}
	if at.IsZero() {
		at = s.now()
	}
	if id == "" {
		id = session.NewID("evt_", at)
	}
	return id, []any{"id", id, "type", typ, "session_id", sessionID, "project_id", project,
		"at", at.UnixMilli(), "object", b}, nil
}

// DecodeEvent parses an outbox stream entry's fields.
func DecodeEvent(streamID string, values map[string]any) (Event, error) {
	str := func(k string) string { v, _ := values[k].(string); return v }
	ev := Event{
		StreamID: streamID, ID: str("id"), Type: str("type"), SessionID: str("session_id"),
		ProjectID: str("project_id"), From: session.State(str("from")), To: session.State(str("to")),
		Driver: session.Driver(str("driver")), Reason: session.Reason(str("reason")), Rule: str("rule"),
	}
	ev.AtMs, _ = strconv.ParseInt(str("at"), 10, 64)
	ev.Version, _ = strconv.ParseInt(str("version"), 10, 64)
	if o := str("object"); o != "" {
		ev.Object = json.RawMessage(o)
	}
	if ev.ID == "" || ev.Type == "" {
		return ev, fmt.Errorf("outbox entry %s: missing id or type", streamID)
	}
	h := map[string]string{}
	for k, v := range values {
		if f, ok := strings.CutPrefix(k, "h."); ok {
			h[f], _ = v.(string)
		}
	}
	if len(h) > 0 {
		s, err := decode(h)
		if err != nil {
			return ev, fmt.Errorf("outbox entry %s: %w", streamID, err)
		}
		ev.Session = s
	}
	return ev, nil
}

// OutboxEvents answers every entry still in the project's outbox, oldest first: for
// inspecting a project (consumers read it through consumer groups instead).
func (s *Store) OutboxEvents(ctx context.Context, project string) ([]Event, error) {
	msgs, err := s.rdb.XRange(ctx, Outbox(project), "-", "+").Result()
	if err != nil {
		return nil, fmt.Errorf("read the outbox of %s: %w", project, err)
	}
	out := make([]Event, 0, len(msgs))
	for _, m := range msgs {
		ev, err := DecodeEvent(m.ID, m.Values)
		if err != nil {
			return nil, fmt.Errorf("read the outbox of %s: %w", project, err)
		}
		out = append(out, ev)
	}
	return out, nil
}
