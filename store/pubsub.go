package store

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// channelWatch is one subscription's channel and what its subscriber does with what it
// receives (watchChannel).
type channelWatch struct {
	channel string
	// sharded: SSUBSCRIBE on a Cluster (for a channel written with SPUBLISH); else SUBSCRIBE,
	// which receives a Cluster's PUBLISH made on any of its nodes.
	sharded bool
	// live is called with false when the subscription is lost (or could not be made), and
	// with true each time it holds, before any message is delivered.
	live func(live bool)
	// message is called with each message's payload, on the subscription's goroutine.
	message func(ctx context.Context, payload string)
	// lost is logged, with the error, when the subscription is lost.
	lost string
}

// watchChannel subscribes to w.channel and hands every message to w until ctx ends,
// subscribing again (after changeRetry) whenever the subscription is lost.
func watchChannel(ctx context.Context, rdb redis.UniversalClient, log *slog.Logger, w channelWatch) {
	for ctx.Err() == nil {
		var ps *redis.PubSub
		if cc, ok := rdb.(*redis.ClusterClient); ok && w.sharded {
			ps = cc.SSubscribe(ctx, w.channel)
		} else {
			ps = rdb.Subscribe(ctx, w.channel)
		}
		// A blocked read does not watch ctx: closing the subscription ends it.
		stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
		err := receive(ctx, ps, w)
		stop()
		_ = ps.Close()
		w.live(false)
		if ctx.Err() != nil {
			return
		}
		log.Warn(w.lost, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(changeRetry):
		}
	}
}

// receive reads the subscription until it fails.
func receive(ctx context.Context, ps *redis.PubSub, w channelWatch) error {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, changePing)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged && ctx.Err() == nil {
				// Quiet for a while: a live connection answers a ping, a dead one never does.
				if err := ps.Ping(ctx); err != nil {
					return err
				}
				pinged = true
				continue
			}
			return err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				w.live(true)
			case "unsubscribe", "sunsubscribe":
				// A Cluster drops a sharded subscription when its slot moves (a failover,
				// a resharding): subscribe again, where the slot is now.
				return errors.New("unsubscribed by the server")
			}
		case *redis.Message:
			w.message(ctx, m.Payload)
		}
	}
}

// StartWatch is what a subscriber to StartsChannel does with what it receives.
type StartWatch struct {
	// Started is told of a session that left pending and provisioning. It runs on the
	// subscription's goroutine, so it must be quick.
	Started func(SessionRef)
	// Live as ChangeWatch.Live: with false, sessions may start unannounced from then on;
	// with true each time the subscription holds, before any session is announced (those
	// that started in between were not).
	Live func(live bool)
}

// maxStartMessage bounds a StartsChannel message: a project's id, "/", a session's id.
const maxStartMessage = 2*256 + 1

// WatchStarts subscribes to StartsChannel and hands every session announced to w until ctx
// ends, subscribing again whenever the subscription is lost. A message that does not name a
// session ("PROJECT/SESSION", at most maxStartMessage bytes) is dropped.
func (s *Store) WatchStarts(ctx context.Context, log *slog.Logger, w StartWatch) {
	if log == nil {
		log = slog.Default()
	}
	watchChannel(ctx, s.rdb, log, channelWatch{channel: StartsChannel, live: w.Live,
		message: func(_ context.Context, payload string) {
			if len(payload) > maxStartMessage {
				return
			}
			if r, ok := parseRef(payload); ok {
				w.Started(r)
			}
		},
		lost: "session starts: subscription lost; runs look for their session's start more often until it is back"})
}
