package quota

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
	"wb/store"
)

// Limits are a project's spend caps and concurrency (PUT /v1/limits). A cap of 0 is none.
type Limits struct {
	MonthlySpendCapMicroUSD        int64 `json:"monthly_spend_cap_micro_usd"`
	EndUserMonthlySpendCapMicroUSD int64 `json:"end_user_monthly_spend_cap_micro_usd"`
	Concurrency                    int   `json:"concurrency"`
}

// SoftCapPercent is where a cap warns before it stops anything.
const SoftCapPercent = 80

// capFlag marks a cap reached this month; admissions in its scope answer 402 while the hard
// one is set (by the hard cap, or by a soft cap's decision: softStopPrefix).
func capFlag(p, endUser, level, month string) string {
	if endUser == "" {
		return store.ProjectKeys(p).CapFlag(level, month)
	}
	return store.ProjectKeys(p).EndUserCapFlag(endUser, level, month)
}

// softStopPrefix starts the value of a hard cap's flag set by a soft cap's decision that
// denied admissions (Accounts.stopAdmissions), then the spend in micro-USD: admissions read
// the flag's presence alone, and refuse creates in its scope with 402 as they do past the
// hard cap; Caps still flags the hard cap when it is crossed, and a raise lifts it only with
// the soft cap's flag (the uncap scripts).
const softStopPrefix = "soft:"

// softStopLua defines soft_stop(v), isSoftStop for the scripts: v a flag's GET (false when
// the flag is not there).
const softStopLua = `
local function soft_stop(v)
  return v and string.sub(v, 1, #'` + softStopPrefix + `') == '` + softStopPrefix + `'
end
`

// capSoftDeny records a soft cap's decision that denied admissions (Accounts.stopAdmissions),
// holding the value it gave the hard flag: the hard cap, crossed after it, overwrites that
// value with its spend, and a raise that leaves the spend under the hard cap but past the
// soft level sets the flag back from this record (the uncap scripts).
func capSoftDeny(p, endUser, month string) string {
	if endUser == "" {
		return store.ProjectKeys(p).CapSoftDeny(month)
	}
	return store.ProjectKeys(p).EndUserCapSoftDeny(endUser, month)
}

// isSoftStop answers whether a hard cap's flag of value v was set by a soft cap's decision.
func isSoftStop(v string) bool { return strings.HasPrefix(v, softStopPrefix) }

// capLifted marks a hard cap crossed this month whose flag a spend decision deleted, to let
// admissions go on (Accounts.liftStop): Caps sets the flag again only when neither is set.
func capLifted(p, endUser, month string) string {
	if endUser == "" {
		return store.ProjectKeys(p).CapLifted(month)
	}
	return store.ProjectKeys(p).EndUserCapLifted(endUser, month)
}

// getLimits reads a project's caps.
func getLimits(ctx context.Context, rdb redis.UniversalClient, project string) (Limits, error) {
	m, err := rdb.HGetAll(ctx, store.ProjectKeys(project).Limits()).Result()
	if err != nil {
		return Limits{}, fmt.Errorf("limits: %w", err)
	}
	n := func(k string) int64 { v, _ := strconv.ParseInt(m[k], 10, 64); return v }
	return Limits{MonthlySpendCapMicroUSD: n("cap"), EndUserMonthlySpendCapMicroUSD: n("eu_cap")}, nil
}

// Validate checks the caps' ranges.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"monthly_spend_cap_micro_usd", l.MonthlySpendCapMicroUSD}, {"end_user_monthly_spend_cap_micro_usd", l.EndUserMonthlySpendCapMicroUSD}} {
		if f.v < 0 || f.v > 1e15 {
			return &session.FieldError{Field: f.name, Message: fmt.Sprintf("must be 0 (no cap) to 10^15 micro-USD, got %d", f.v)}
		}
	}
	return nil
}

// CapEvent is a cap crossed: the project's, or one end user's.
type CapEvent struct {
	Project       string `json:"project_id"`
	EndUser       string `json:"end_user_id,omitempty"`
	Scope         string `json:"scope"` // project | end_user
	Level         string `json:"level"` // soft | hard
	SpendMicroUSD int64  `json:"spend_micro_usd"`
	CapMicroUSD   int64  `json:"cap_micro_usd"`
	Month         string `json:"month"`

	// undecided is the cap's undecided stop as Caps held it (flag), for OnCap to replace
	// with its decision; crossedAt is when the cap was crossed (zero: now). crossing is the
	// crossing's time as its undecided stop holds it, which names its quota.exceeded
	// (capEventID) however often it is decided.
	undecided string
	crossedAt time.Time
	crossing  time.Time
}

// Caps watches settled spend against the caps and calls OnCap once per cap, level and month.
// The settler flags a crossed cap as it settles, under the project's settlement lock, and
// calls OnCap (act) after releasing it: OnCap stops sessions, node calls that may outlast the
// lock's lease, and stopping sessions needs no lock of the settlement's.
type Caps struct {
	rdb     redis.UniversalClient
	st      *store.Store
	onCap   func(context.Context, CapEvent)
	log     *slog.Logger
	mu      sync.Mutex
	cache   map[string]cachedLimits
	crossed map[string][]CapEvent // project → caps crossed and flagged, for act
}

type cachedLimits struct {
	l  Limits
	at time.Time
}

// NewCaps returns a cap watcher that calls onCap (in the settler's goroutine) when a cap is
// first crossed.
func NewCaps(rdb redis.UniversalClient, onCap func(context.Context, CapEvent), log *slog.Logger) *Caps {
	if log == nil {
		log = slog.Default()
	}
	return &Caps{rdb: rdb, st: store.New(rdb), onCap: onCap, log: log, cache: map[string]cachedLimits{}, crossed: map[string][]CapEvent{}}
}

func (c *Caps) limits(ctx context.Context, project string) (Limits, error) {
	c.mu.Lock()
	e, ok := c.cache[project]
	c.mu.Unlock()
	if ok && time.Since(e.at) < time.Second {
		return e.l, nil
	}
	l, err := getLimits(ctx, c.rdb, project)
	if err != nil {
		return l, err
	}
	c.mu.Lock()
	c.cache[project] = cachedLimits{l, time.Now()}
	c.mu.Unlock()
	return l, nil
}

// observe checks the month totals (nano-USD) after a settled record.
func (c *Caps) observe(ctx context.Context, r Record, projectNano, endUserNano int64) {
	l, err := c.limits(ctx, r.ProjectID)
	if err != nil {
		c.log.Warn("caps: limits", "project", r.ProjectID, "err", err)
		return
	}
	month := monthOf(time.UnixMilli(r.ToMs))
	c.check(ctx, CapEvent{Project: r.ProjectID, Scope: "project", SpendMicroUSD: projectNano / 1000, CapMicroUSD: l.MonthlySpendCapMicroUSD, Month: month})
	if r.EndUserID != "" {
		c.check(ctx, CapEvent{Project: r.ProjectID, EndUser: r.EndUserID, Scope: "end_user", SpendMicroUSD: endUserNano / 1000, CapMicroUSD: l.EndUserMonthlySpendCapMicroUSD, Month: month})
	}
}

func (c *Caps) check(ctx context.Context, ev CapEvent) {
	if ev.CapMicroUSD <= 0 {
		return
	}
	for _, lv := range []struct {
		level string
		at    int64
	}{{"hard", ev.CapMicroUSD}, {"soft", ev.CapMicroUSD * SoftCapPercent / 100}} {
		if ev.SpendMicroUSD < lv.at {
			continue
		}
		first, undecided, err := c.flag(ctx, ev, lv.level)
		if err != nil {
			c.log.Warn("caps: flag", "err", err)
			return
		}
		if first {
			ev.Level, ev.undecided = lv.level, undecided
			c.log.Info("spend cap crossed", "project", ev.Project, "end_user", ev.EndUser, "level", ev.Level, "spend_micro_usd", ev.SpendMicroUSD, "cap_micro_usd", ev.CapMicroUSD)
			if c.onCap != nil {
				c.mu.Lock()
				c.crossed[ev.Project] = append(c.crossed[ev.Project], ev)
				c.mu.Unlock()
			}
		}
		return // the hard cap implies the soft one
	}
}

// act calls OnCap for each cap crossed in project's settled spend since its last call, in
// order. The settler calls it once it no longer holds the project's settlement lock.
func (c *Caps) act(ctx context.Context, project string) {
	c.mu.Lock()
	evs := c.crossed[project]
	delete(c.crossed, project)
	c.mu.Unlock()
	for _, ev := range evs {
		c.onCap(ctx, ev)
	}
}

// capFlagTTL keeps a cap's flags (and the set of end users flagged) a little longer than the
// month they name, then lets Redis drop them.
const capFlagTTL = 40 * 24 * time.Hour

// flagScript sets a cap's flag if it is not set, answering 1 if it did. An end user's is first
// added to the month's set of end users flagged, so that a raised end-user cap finds the flags
// to lift (Accounts.UncapEndUsers). With the flag it writes the crossing's undecided stop
// among the project's undecided stops (Enforcer.RetryStops), in the same step: the settler that
// flags the cap decides it only after the settle (Caps.act), and one that died in between
// left the flag, which is set once a month, and nothing that would ever decide the crossing
// (a hard cap's stop and quota.exceeded; a soft cap's decision, which plugins and policies
// hear of and may act on).
//
// A hard cap's lifted mark (capLifted) counts as its flag: the cap was crossed, and the
// decision let admissions go on. A hard flag that a soft cap's decision set to refuse
// admissions (softStopPrefix) does not: the hard cap is crossed for the first time, and
// decided (its quota.exceeded, its stop), the flag then holding its spend.
//
// KEYS: the flag, its lifted mark (the flag again for a soft cap), the project's undecided
// stops, the capped end users set (end users only). ARGV: the flag's value, TTL s, end user,
// undecided stop's field (empty for none), undecided stop.
var flagScript = redis.NewScript(softStopLua + `
if KEYS[2] ~= KEYS[1] and redis.call('EXISTS', KEYS[2]) > 0 then return 0 end
local v = redis.call('GET', KEYS[1])
if v and not soft_stop(v) then return 0 end
if KEYS[4] then
  redis.call('SADD', KEYS[4], ARGV[3])
  redis.call('EXPIRE', KEYS[4], ARGV[2])
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
return 1
`)

// flag sets the cap's flag of level, answering whether it was the first to. It is set with
// the crossing's undecided stop when there is an OnCap to decide it (flagScript), which the
// decision then replaces (Enforcer.OnCap); the project is indexed among those with undecided
// stops before (a crash after the script leaves the stop found) and after (RetryStops may
// have dropped it from the index meanwhile: ForgetCapUndecidedProject).
func (c *Caps) flag(ctx context.Context, ev CapEvent, level string) (first bool, undecided string, err error) {
	k := store.ProjectKeys(ev.Project)
	key := capFlag(ev.Project, ev.EndUser, level, ev.Month)
	lifted := key
	if level == "hard" {
		lifted = capLifted(ev.Project, ev.EndUser, ev.Month)
	}
	keys := []string{key, lifted, k.CapUndecided()}
	if ev.EndUser != "" {
		keys = append(keys, k.CappedEndUsers(ev.Month))
	}
	field := ""
	if c.onCap != nil {
		// Past the cap, every record settled comes here: one command while the flag is set.
		vs, err := c.rdb.MGet(ctx, key, lifted).Result()
		if err != nil {
			return false, "", err
		}
		for _, v := range vs {
			if s, ok := v.(string); ok && !isSoftStop(s) {
				return false, "", nil
			}
		}
		ev.Level = level
		b, err := json.Marshal(heldStop{CapEvent: ev, CrossedAt: time.Now(), Undecided: true})
		if err != nil {
			return false, "", err
		}
		field, undecided = undecidedStopID(ev.EndUser, ev.Month, level), string(b)
		if err := c.index(ctx, ev.Project); err != nil {
			return false, "", err
		}
	}
	n, err := flagScript.Run(ctx, c.rdb, keys, ev.SpendMicroUSD, int64(capFlagTTL/time.Second), ev.EndUser, field, undecided).Int64()
	if err != nil || n == 0 {
		return false, "", err
	}
	if field != "" {
		if err := c.index(ctx, ev.Project); err != nil {
			c.log.Warn("caps: index the undecided stop", "project", ev.Project, "err", err)
		}
	}
	return true, undecided, nil
}

// index adds project to the projects with undecided stops.
func (c *Caps) index(ctx context.Context, project string) error {
	return c.st.IndexCapUndecided(ctx, project)
}

// CapMonth answers the month (YYYYMM, UTC) whose cap flags stop admissions at t.
func CapMonth(t time.Time) string { return monthOf(t) }
