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

// Uncap lifts the project's cap's admission stop this month (after the cap was raised), and
// the stop of its sessions a crossing left unfinished (Enforcer.RetryStops).
func (a *Accounts) Uncap(ctx context.Context, project string, now time.Time) error {
	month := monthOf(now)
	if _, err := a.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, capFlag(project, "", "hard", month), capFlag(project, "", "soft", month))
		p.HDel(ctx, store.ProjectKeys(project).CapStops(), capStopID("", month))
		return nil
	}); err != nil {
		return fmt.Errorf("lift the spend cap of %s: %w", project, err)
	}
	return nil
}

// liftStop deletes the admission stop a crossed hard cap set (a spend decision that does not
// deny admissions).
func (a *Accounts) liftStop(ctx context.Context, ev CapEvent) error {
	return a.rdb.Del(ctx, capFlag(ev.Project, ev.EndUser, "hard", ev.Month)).Err()
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

// uncapEndUsers is UncapEndUsers for one batch of flagged end users.
func (a *Accounts) uncapEndUsers(ctx context.Context, project string, endUsers []string, capMicroUSD int64, month string) error {
	if len(endUsers) == 0 {
		return nil
	}
	k := store.ProjectKeys(project)
	fields := make([]string, len(endUsers))
	for i, eu := range endUsers {
		fields[i] = "eu:" + eu + ":m:" + month
	}
	spends, err := a.rdb.HMGet(ctx, k.Spend(), fields...).Result()
	if err != nil {
		return err
	}
	_, err = a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, eu := range endUsers {
			v, _ := spends[i].(string)
			nano, _ := strconv.ParseInt(v, 10, 64)
			spend := nano / 1000
			if capMicroUSD > 0 && spend >= capMicroUSD {
				continue // still over the cap: stopped
			}
			p.Del(ctx, capFlag(project, eu, "hard", month))
			p.HDel(ctx, k.CapStops(), capStopID(eu, month))
			if capMicroUSD > 0 && spend >= capMicroUSD*SoftCapPercent/100 {
				continue // still past the soft cap
			}
			p.Del(ctx, capFlag(project, eu, "soft", month))
			p.SRem(ctx, k.CappedEndUsers(month), eu)
		}
		return nil
	})
	return err
}
