package store

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Gateways keep a project's API keys, plan, policies and plugins in memory instead of reading
// them for every request. Each write of those announces its project on ChangesChannel, and
// waits until every gateway that received the announcement has dropped its copy: PUBLISH
// answers how many subscribers got the message, and each gateway, once it has dropped what it
// held, pushes one element on the message's acknowledgement list, which the writer pops. So
// when the write answers, the next request on any subscribed gateway reads the new
// configuration. A gateway whose subscription is down trusts nothing it cached, and drops
// everything when the subscription holds again (what was published meanwhile is lost).

// ChangeKind says what of a project's configuration changed.
type ChangeKind string

// Kinds of change.
const (
	ChangeKeys     ChangeKind = "keys"     // an API key revoked
	ChangePlan     ChangeKind = "plan"     // the plan's limits, the operator's or the tenant's lowered ones
	ChangePolicies ChangeKind = "policies" // a policy version stored
	ChangePlugins  ChangeKind = "plugins"  // a plugin stored or deleted, or the plugin limits
)

// ProjectChange is one message on ChangesChannel; one with no Project concerns every project.
type ProjectChange struct {
	ID      string     `json:"id"`
	Project string     `json:"project"`
	Kind    ChangeKind `json:"kind"`
}

// DefaultChangeWait bounds how long a write waits for the gateways' acknowledgements: a
// gateway that does not answer in time (it is stuck, or its connection died without Redis
// noticing yet) is logged and not waited for.
const DefaultChangeWait = 2 * time.Second

const (
	// changeAckTTL keeps an acknowledgement list a while after its writer stopped waiting.
	changeAckTTL = 30 * time.Second
	// changePing is how long a subscription may stay quiet before it is pinged; a ping not
	// answered within another changePing is a dead connection.
	changePing = 5 * time.Second
	// changeRetry is the pause between two attempts to subscribe.
	changeRetry = time.Second
)

// Changes announces changes of projects' configuration and, on a gateway, receives them. Safe
// for concurrent use.
type Changes struct {
	rdb  redis.UniversalClient
	log  *slog.Logger
	wait time.Duration
}

// NewChanges answers the announcer of changes over rdb; log nil is slog.Default.
func NewChanges(rdb redis.UniversalClient, log *slog.Logger) *Changes {
	if log == nil {
		log = slog.Default()
	}
	return &Changes{rdb: rdb, log: log, wait: DefaultChangeWait}
}

// Changes answers the store's announcer, for gateways to Watch.
func (s *Store) Changes() *Changes { return s.changes }

// Publish announces that project's configuration of kind changed, and waits (DefaultChangeWait
// at most) until every gateway that received the announcement has dropped its copy. It answers
// how many received it and how many acknowledged. It never fails the write that called it: a
// failure is logged, and gateways that missed the change drop their copy at their TTL, or
// when their subscription is made again.
func (c *Changes) Publish(ctx context.Context, project string, kind ChangeKind) (told, acked int) {
	ch := ProjectChange{ID: session.NewID("chg_", time.Now()), Project: project, Kind: kind}
	b, err := json.Marshal(ch)
	if err != nil {
		c.log.WarnContext(ctx, "project change: cannot encode", "project", project, "kind", kind, "err", err)
		return 0, 0
	}
	var n int64
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		n, err = cc.SPublish(ctx, ChangesChannel, b).Result()
	} else {
		n, err = c.rdb.Publish(ctx, ChangesChannel, b).Result()
	}
	if err != nil {
		c.log.WarnContext(ctx, "project change: cannot publish; gateways drop their copy at their TTL", "project", project, "kind", kind, "err", err)
		return 0, 0
	}
	told = int(n)
	acked, err = c.awaitAcks(ctx, ch.ID, told)
	if err != nil || acked < told {
		c.log.WarnContext(ctx, "project change: not every gateway acknowledged; the others drop their copy at their TTL",
			"project", project, "kind", kind, "told", told, "acked", acked, "wait", c.wait, "err", err)
	}
	return told, acked
}

// awaitAcks pops the acknowledgements of change id until n came or the wait is over.
func (c *Changes) awaitAcks(ctx context.Context, id string, n int) (int, error) {
	key := changeAckKey(id)
	deadline := time.Now().Add(c.wait)
	acked := 0
	for acked < n {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		// BLPOP counts whole seconds, and 0 would block for ever: round up.
		secs := (left + time.Second - 1) / time.Second
		err := c.rdb.BLPop(ctx, secs*time.Second, key).Err()
		if errors.Is(err, redis.Nil) {
			break
		}
		if err != nil {
			return acked, err
		}
		acked++
	}
	return acked, nil
}

// ChangeWatch is what a subscriber does with what it receives.
type ChangeWatch struct {
	// Changed drops what the subscriber holds of the change's project (of every project when
	// Project is ""). The change is acknowledged once it returns, so it must be quick.
	Changed func(ProjectChange)
	// Live is called with false when the subscription is lost (or could not be made):
	// changes may be missed from then on, so the subscriber must trust nothing it holds; and
	// with true each time the subscription holds, before any change is delivered: the
	// subscriber drops everything it holds, since what changed in between was not delivered.
	Live func(live bool)
}

// Watch subscribes to ChangesChannel and hands every change to w until ctx ends, subscribing
// again whenever the subscription is lost.
func (c *Changes) Watch(ctx context.Context, w ChangeWatch) {
	watchChannel(ctx, c.rdb, c.log, channelWatch{channel: ChangesChannel, sharded: true, live: w.Live,
		message: func(ctx context.Context, payload string) { c.deliver(ctx, payload, w) },
		lost:    "project changes: subscription lost; cached projects are not trusted until it is back"})
}

// deliver hands one message to w and acknowledges it.
func (c *Changes) deliver(ctx context.Context, payload string, w ChangeWatch) {
	var ch ProjectChange
	if err := json.Unmarshal([]byte(payload), &ch); err != nil {
		c.log.Warn("project changes: a message that is not a change; dropping every project", "err", err)
		ch = ProjectChange{}
	}
	w.Changed(ch)
	if ch.ID == "" {
		return
	}
	key := changeAckKey(ch.ID)
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.RPush(ctx, key, 1)
		p.Expire(ctx, key, changeAckTTL)
		return nil
	})
	if err != nil && ctx.Err() == nil {
		c.log.Warn("project changes: cannot acknowledge; its writer waits for it in vain", "change", ch.ID, "err", err)
	}
}
