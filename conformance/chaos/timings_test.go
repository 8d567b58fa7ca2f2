package chaos_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"wb/webhooks"
)

// TimingsEnv selects the suite's timings: unset or "short" for make test's, "real" for make
// bench-fleet's.
const TimingsEnv = "WB_CHAOS_TIMINGS"

// timings are the durations the chaos cases run with. Short ones stand in for real ones in
// make test; real ones are the and wb's and Redis's defaults. Every bound a case
// checks that depends on them is derived from them.
type timings struct {
	name string // "short" or "real"
	// receiverDown is how long the webhook receiver refuses every delivery (the ten
	// minutes).
	receiverDown time.Duration
	// webhookMaxBackoff caps the gateways' waits between two attempts of a delivery
	// (--webhook-max-backoff); 0 passes no flag: wb's default, webhooks.DefaultMaxBackoff.
	webhookMaxBackoff time.Duration
	// clusterNodeTimeout is the Redis Cluster's cluster-node-timeout: how long a silent
	// primary lives on before its replica takes over.
	clusterNodeTimeout time.Duration
	// nodeTimeout is the gateways' --node-timeout (0: wb serve's default) in both modes;
	// WB_CHAOS_NODE_TIMEOUT sets another, to measure it.
	nodeTimeout time.Duration
}

// pickupSlack is what a delivery due after an outage takes on top of its backoff: the
// dispatcher's scan of due queues, the attempt, and the rest of the session's queue behind
// its head, on a loaded machine.
const pickupSlack = 5 * time.Second

// loadTimings reads the suite's switch (TimingsEnv) and WB_CHAOS_NODE_TIMEOUT.
func loadTimings() (timings, error) {
	tm := timings{name: "short",
		// 20 s against a 1 s cap stand for ten minutes against wb's hour: a receiver that comes
		// back hears within about a second in both.
		receiverDown: 20 * time.Second, webhookMaxBackoff: time.Second,
		// A replica takes over within a few seconds.
		clusterNodeTimeout: 2 * time.Second}
	switch v := os.Getenv(TimingsEnv); v {
	case "", "short":
	case "real":
		tm = timings{name: "real", receiverDown: 10 * time.Minute, webhookMaxBackoff: 0,
			clusterNodeTimeout: 15 * time.Second} // redis.conf's default cluster-node-timeout
	default:
		return timings{}, fmt.Errorf("%s=%q: want short or real", TimingsEnv, v)
	}
	if v := os.Getenv("WB_CHAOS_NODE_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return timings{}, fmt.Errorf("WB_CHAOS_NODE_TIMEOUT: %w", err)
		}
		tm.nodeTimeout = d
	}
	return tm, nil
}

func (tm timings) String() string {
	nt := "wb serve's default"
	if tm.nodeTimeout > 0 {
		nt = tm.nodeTimeout.String()
	}
	return fmt.Sprintf("%s: webhook receiver down %v, webhook waits capped at %v (delivered within %v after), cluster-node-timeout %v, --node-timeout %s",
		tm.name, tm.receiverDown, tm.maxBackoff(), tm.deliveredWithin(), tm.clusterNodeTimeout, nt)
}

// maxBackoff is the cap on the gateways' webhook waits in force.
func (tm timings) maxBackoff() time.Duration {
	if tm.webhookMaxBackoff > 0 {
		return tm.webhookMaxBackoff
	}
	return webhooks.DefaultMaxBackoff
}

// gatewayArgs are the gateways' flags that carry the timings.
func (tm timings) gatewayArgs() []string {
	if tm.webhookMaxBackoff > 0 {
		return []string{"--webhook-max-backoff", tm.webhookMaxBackoff.String()}
	}
	return nil
}

// retriedWithin answers how long after the receiver is back a delivery first refused at the
// outage's start waits, at most, for its next attempt: the attempts come as early as the
// shortest waits allow (webhooks.BackoffRange), and the last that can still fall in the outage
// waits the longest its wait can be. A delivery first refused later has made no more attempts
// by then, so waits no longer. (Short: 1 s. Real: ten minutes reach the 8th attempt at the
// earliest, 508 s in, and its wait is up to 640 s.)
func (tm timings) retriedWithin() time.Duration {
	var earliest time.Duration // of attempt n
	for n := 1; ; n++ {
		lo, hi := webhooks.BackoffRange(n, tm.maxBackoff())
		if earliest+lo >= tm.receiverDown {
			return hi // attempt n+1 comes after the outage, whatever the jitter
		}
		earliest += lo
	}
}

// deliveredWithin bounds how long after the receiver is back each event arrives.
func (tm timings) deliveredWithin() time.Duration { return tm.retriedWithin() + pickupSlack }

// TestTimings: the switch selects the short or the real timings and refuses anything else,
// and the webhook bound follows wb's backoff: 1 s against the short cap, 640 s (the 8th wait)
// after ten minutes of wb's default waits.
func TestTimings(t *testing.T) {
	t.Setenv("WB_CHAOS_NODE_TIMEOUT", "")
	for _, c := range []struct {
		env     string
		name    string
		cluster time.Duration
		retried time.Duration
		gwArgs  int
	}{
		{"", "short", 2 * time.Second, time.Second, 2},
		{"short", "short", 2 * time.Second, time.Second, 2},
		{"real", "real", 15 * time.Second, 640 * time.Second, 0},
	} {
		t.Setenv(TimingsEnv, c.env)
		tm, err := loadTimings()
		if err != nil {
			t.Fatal(err)
		}
		if tm.name != c.name || tm.clusterNodeTimeout != c.cluster || tm.retriedWithin() != c.retried || len(tm.gatewayArgs()) != c.gwArgs {
			t.Errorf("%s=%q: %+v, retried within %v, gateway flags %v", TimingsEnv, c.env, tm, tm.retriedWithin(), tm.gatewayArgs())
		}
	}
	t.Setenv(TimingsEnv, "long")
	if _, err := loadTimings(); err == nil || !strings.Contains(err.Error(), TimingsEnv) {
		t.Errorf("%s=long: %v, want an error naming it", TimingsEnv, err)
	}
}
