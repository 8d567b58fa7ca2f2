package quota

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/store"
)

// Accounts reads and writes what a project's account holds: its spend caps, the admission
// stops they set, its settled spend and usage reports. Safe for concurrent use.
type Accounts struct{ rdb redis.UniversalClient }

// NewAccounts returns the accounts kept in rdb.
func NewAccounts(rdb redis.UniversalClient) *Accounts { return &Accounts{rdb: rdb} }

// Limits reads a project's caps (concurrency is the store's and is filled in by callers).
func (a *Accounts) Limits(ctx context.Context, project string) (Limits, error) {
	return getLimits(ctx, a.rdb, project)
}

// SetLimits writes a project's caps after checking them.
func (a *Accounts) SetLimits(ctx context.Context, project string, l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if err := a.rdb.HSet(ctx, store.ProjectKeys(project).Limits(), "cap", l.MonthlySpendCapMicroUSD, "eu_cap", l.EndUserMonthlySpendCapMicroUSD).Err(); err != nil {
		return fmt.Errorf("set limits of %s: %w", project, err)
	}
	return nil
}

// uncapScript lifts the project's cap's flags this month if its spend is under the raised
// cap, reading the spend and deleting the flags in one step, as uncapEndUsersScript does for
// the end users (and for the same reason): the hard flag, its lifted mark and the cap's held
// and undecided stops when the spend is under the hard cap, the soft flag, its soft deny
// record and the soft cap's held and undecided stops too when it is under the soft one. A
// hard flag that a soft cap's decision set (softStopPrefix) goes with the soft flag: the
// cap's soft level still crossed, the decision to refuse admissions stands (and the soft cap
// is not crossed again, to be decided again). The hard cap crossed after that decision
// overwrote the flag with its spend: the flag is then set back from the soft deny record
// (capSoftDeny), with the record's TTL, when the soft flag is still there. It answers 1 if it
// lifted the hard cap's.
//
// KEYS: spend hash, hard flag, soft flag, lifted mark, held stops hash, undecided stops hash,
// soft deny record. ARGV: month, hard threshold nano (empty for no cap), soft threshold nano,
// the held and undecided stops' fields, the soft cap's undecided and held stops' fields.
var uncapScript = redis.NewScript(decimalGELua + softStopLua + keepSoftDenyLua + `
local month, hard, soft = ARGV[1], ARGV[2], ARGV[3]
local spend = redis.call('HGET', KEYS[1], 'm:' .. month) or '0'
if string.sub(spend, 1, 1) == '-' then spend = '0' end
if hard ~= '' and ge(spend, hard) then return 0 end
local under_soft = hard == '' or not ge(spend, soft)
if under_soft or not keep_soft_deny(KEYS[2], KEYS[3], KEYS[7]) then redis.call('DEL', KEYS[2]) end
redis.call('DEL', KEYS[4])
redis.call('HDEL', KEYS[5], ARGV[4])
redis.call('HDEL', KEYS[6], ARGV[5])
if under_soft then
  redis.call('DEL', KEYS[3], KEYS[7])
  redis.call('HDEL', KEYS[6], ARGV[6])
  redis.call('HDEL', KEYS[5], ARGV[7])
end
return 1
`)

// keepSoftDenyLua defines keep_soft_deny(hard, soft, deny) for the uncap scripts, on a raise
// that leaves the spend under the hard cap but past the soft level: it answers whether the
// hard flag (key hard) stays, as a soft cap's decision to deny admissions set it
// (softStopPrefix), setting it back from the soft deny record (key deny) with the record's
// TTL when the hard cap's crossing overwrote it since; the record counts only while the soft
// flag (key soft) is there (a binary older than the record lifts the soft flag alone).
const keepSoftDenyLua = `
local function keep_soft_deny(hard, soft, deny)
  if soft_stop(redis.call('GET', hard)) then return true end
  if redis.call('EXISTS', soft) == 0 then return false end
  local v = redis.call('GET', deny)
  local ttl = redis.call('PTTL', deny)
  if not soft_stop(v) or ttl <= 0 then return false end
  redis.call('SET', hard, v, 'PX', ttl)
  return true
end
`

// Uncap lifts the project's cap's admission stop this month after the cap was raised to
// capMicroUSD (or removed, 0), if its spend this month is under it (and the soft cap's mark
// if under that too), and the stop of its sessions a crossing left unfinished
// (Enforcer.RetryStops).
func (a *Accounts) Uncap(ctx context.Context, project string, capMicroUSD int64, now time.Time) error {
	k, month := store.ProjectKeys(project), monthOf(now)
	hard, soft := capThresholds(capMicroUSD)
	if err := uncapScript.Run(ctx, a.rdb, []string{k.Spend(), capFlag(project, "", "hard", month), capFlag(project, "", "soft", month),
		capLifted(project, "", month), k.CapStops(), k.CapUndecided(), capSoftDeny(project, "", month)}, month, hard, soft, capStopID("", month), undecidedStopID("", month, "hard"), undecidedStopID("", month, "soft"),
		heldStopID("", month, "soft")).Err(); err != nil {
		return fmt.Errorf("lift the spend cap of %s: %w", project, err)
	}
	return nil
}

// capThresholds answers a cap of capMicroUSD's hard and soft thresholds in nano-USD, as
// decimal strings for the uncap scripts (empty for no cap). A spend of n nano-USD is past a
// cap of c micro-USD when n/1000 >= c, so when n >= c×1000.
func capThresholds(capMicroUSD int64) (hard, soft string) {
	if capMicroUSD <= 0 {
		return "", ""
	}
	return strconv.FormatInt(capMicroUSD*1000, 10), strconv.FormatInt(capMicroUSD*SoftCapPercent/100*1000, 10)
}

// decimalGELua defines ge(a, b), a >= b for decimal strings of non-negative integers: spends
// in nano-USD may pass 2^53, where Lua's numbers end.
const decimalGELua = `
local function ge(a, b)
  if #a ~= #b then return #a > #b end
  return a >= b
end
`

// liftStopScript replaces a crossed hard cap's flag with its lifted mark, if the cap is still
// crossed: its flag or its mark (a decision taken again) still there. A cap raised meanwhile
// deleted both (Accounts.Uncap), and a mark set after would keep Caps from flagging the
// raised cap when it is crossed, for the rest of the month.
//
// KEYS: the flag, the lifted mark. ARGV: the mark's value, TTL s.
var liftStopScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
redis.call('DEL', KEYS[1])
return 1
`)

// stopAdmissionsScript refuses admissions in a crossed soft cap's scope, setting the hard
// cap's flag (which admissions read) to softStopPrefix and the spend, if the soft cap is
// still crossed (its flag there: a cap raised meanwhile deleted it) and the hard cap's is
// not set nor lifted (the hard cap crossed meanwhile: its decision is the later word). The
// soft deny record (capSoftDeny) keeps the same value: the hard cap crossed after overwrites
// the flag's, and a raise back under it sets the flag again from the record.
//
// KEYS: the soft flag, the hard flag, the hard cap's lifted mark, the soft deny record.
// ARGV: the flag's value, TTL s.
var stopAdmissionsScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
redis.call('SET', KEYS[4], ARGV[1], 'EX', ARGV[2])
return 1
`)

// stopAdmissions refuses new admissions in the scope of ev's crossed soft cap (402), for a
// decision that denies them at the soft level, as the hard cap's flag does, until a raise
// takes the spend under the cap's soft level (Uncap, UncapEndUsers) or the month ends.
func (a *Accounts) stopAdmissions(ctx context.Context, ev CapEvent) error {
	keys := []string{capFlag(ev.Project, ev.EndUser, "soft", ev.Month), capFlag(ev.Project, ev.EndUser, "hard", ev.Month),
		capLifted(ev.Project, ev.EndUser, ev.Month), capSoftDeny(ev.Project, ev.EndUser, ev.Month)}
	v := softStopPrefix + strconv.FormatInt(ev.SpendMicroUSD, 10)
	if err := stopAdmissionsScript.Run(ctx, a.rdb, keys, v, int64(capFlagTTL/time.Second)).Err(); err != nil {
		return fmt.Errorf("stop admissions past the soft spend cap of %s: %w", ev.Project, err)
	}
	return nil
}

// liftStop deletes the admission stop a crossed hard cap set (a spend decision that does not
// deny admissions), leaving its lifted mark in its place: the cap stays crossed this month,
// and the records settled after do not cross it again (a quota.exceeded and a stop each).
func (a *Accounts) liftStop(ctx context.Context, ev CapEvent) error {
	keys := []string{capFlag(ev.Project, ev.EndUser, "hard", ev.Month), capLifted(ev.Project, ev.EndUser, ev.Month)}
	if err := liftStopScript.Run(ctx, a.rdb, keys, ev.SpendMicroUSD, int64(capFlagTTL/time.Second)).Err(); err != nil {
		return fmt.Errorf("lift the spend cap's admission stop of %s: %w", ev.Project, err)
	}
	return nil
}

// CapState answers, in one round trip, which hard cap stops admissions for the project (and
// end user) this month ("project", "end_user" or "") and whether a soft cap was passed.
func (a *Accounts) CapState(ctx context.Context, project, endUser string, now time.Time) (string, bool, error) {
	month := monthOf(now)
	keys := []string{capFlag(project, "", "hard", month), capFlag(project, "", "soft", month)}
	if endUser != "" {
		keys = append(keys, capFlag(project, endUser, "hard", month), capFlag(project, endUser, "soft", month))
	}
	cmds := make([]*redis.IntCmd, len(keys))
	if _, err := a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Exists(ctx, k)
		}
		return nil
	}); err != nil {
		return "", false, fmt.Errorf("spend caps: %w", err)
	}
	set := func(i int) bool { return i < len(cmds) && cmds[i].Val() > 0 }
	scope := ""
	switch {
	case set(0):
		scope = "project"
	case set(2):
		scope = "end_user"
	}
	return scope, set(1) || set(3), nil
}

// Spend answers a project's (or, with endUser, an end user's) settled spend in the month of
// at, in micro-USD.
func (a *Accounts) Spend(ctx context.Context, project, endUser string, at time.Time) (int64, error) {
	field := "m:" + monthOf(at)
	if endUser != "" {
		field = "eu:" + endUser + ":" + field
	}
	v, err := a.rdb.HGet(ctx, store.ProjectKeys(project).Spend(), field).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("spend of %s: %w", project, err)
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return n / 1000, nil
}

// endUserScanBatch is how many capped end users UncapEndUsers reads and lifts per round trip:
// a project may have flagged many, and memory stays bounded by the batch.
const endUserScanBatch = 500

// UncapEndUsers lifts the end users' caps' admission stops this month after the end-user cap
// was raised to capMicroUSD (or removed, 0): each end user whose spend this month is under
// it is admitted again, and loses the soft cap's mark if under that too. It visits the end
// users Caps flagged this month (CappedEndUsers).
func (a *Accounts) UncapEndUsers(ctx context.Context, project string, capMicroUSD int64, now time.Time) error {
	k, month := store.ProjectKeys(project), monthOf(now)
	var cursor uint64
	for {
		endUsers, next, err := a.rdb.SScan(ctx, k.CappedEndUsers(month), cursor, "", endUserScanBatch).Result()
		if err != nil {
			return fmt.Errorf("lift the end users' spend caps of %s: %w", project, err)
		}
		if err := a.uncapEndUsers(ctx, project, endUsers, capMicroUSD, month); err != nil {
			return fmt.Errorf("lift the end users' spend caps of %s: %w", project, err)
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// uncapEndUsersScript lifts the flags of the end users (ARGV) whose spend this month is under
// the raised cap, reading each spend and deleting its flags in one step: a record settled
// between the two could take an end user past the cap while its flag, still set, kept Caps
// from flagging it again, and the flag deleted after would admit an end user over the cap.
// A hard flag that a soft cap's decision set stays with the soft flag, or is set back from
// its soft deny record, as in uncapScript.
// Spends are compared as decimal strings: nano-USD may pass 2^53, where Lua's numbers end.
//
// KEYS: spend hash, capped end users set, held stops hash, undecided stops hash, then each end
// user's hard and soft flags, hard cap's lifted mark and soft deny record. ARGV: month, hard
// threshold nano (” for no cap), soft threshold nano, end users.
var uncapEndUsersScript = redis.NewScript(decimalGELua + softStopLua + keepSoftDenyLua + `
local month, hard, soft = ARGV[1], ARGV[2], ARGV[3]
for i = 4, #ARGV do
  local eu = ARGV[i]
  local spend = redis.call('HGET', KEYS[1], 'eu:' .. eu .. ':m:' .. month) or '0'
  if string.sub(spend, 1, 1) == '-' then spend = '0' end
  local j = 5 + (i - 4) * 4
  if hard == '' or not ge(spend, hard) then
    local under_soft = hard == '' or not ge(spend, soft)
    if under_soft or not keep_soft_deny(KEYS[j], KEYS[j + 1], KEYS[j + 3]) then redis.call('DEL', KEYS[j]) end
    redis.call('DEL', KEYS[j + 2])
    redis.call('HDEL', KEYS[3], month .. ':eu:' .. eu)
    redis.call('HDEL', KEYS[4], month .. ':eu:' .. eu .. ':undecided')
    if under_soft then
      redis.call('DEL', KEYS[j + 1], KEYS[j + 3])
      redis.call('HDEL', KEYS[4], month .. ':eu:' .. eu .. ':soft:undecided')
      redis.call('HDEL', KEYS[3], month .. ':eu:' .. eu .. ':soft')
      redis.call('SREM', KEYS[2], eu)
    end
  end
end
return 0
`)

// uncapEndUsers is UncapEndUsers for one batch of flagged end users, in one script.
func (a *Accounts) uncapEndUsers(ctx context.Context, project string, endUsers []string, capMicroUSD int64, month string) error {
	if len(endUsers) == 0 {
		return nil
	}
	k := store.ProjectKeys(project)
	keys := []string{k.Spend(), k.CappedEndUsers(month), k.CapStops(), k.CapUndecided()}
	hard, soft := capThresholds(capMicroUSD)
	args := []any{month, hard, soft}
	for _, eu := range endUsers {
		keys = append(keys, capFlag(project, eu, "hard", month), capFlag(project, eu, "soft", month), capLifted(project, eu, month),
			capSoftDeny(project, eu, month))
		args = append(args, eu)
	}
	return uncapEndUsersScript.Run(ctx, a.rdb, keys, args...).Err()
}
