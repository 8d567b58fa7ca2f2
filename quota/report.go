package quota

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
	"wb/store"
)

// UsageTotals is settled usage summed over a report's range: of one session, one end user,
// or the whole project.
type UsageTotals struct {
	SessionS    int64 `json:"session_s"`
	PausedS     int64 `json:"paused_s"`
	CPUMs       int64 `json:"cpu_ms"`
	MemGiBMs    int64 `json:"mem_gib_ms"`
	EgressBytes int64 `json:"egress_bytes"`
	CostMicro   int64 `json:"cost_micro_usd"`
}

// UsageLine is settled usage of one session or one end user. DesktopID names the desktop a
// session ran (group_by=session), so a desktop's cost is the sum of its lines.
type UsageLine struct {
	SessionID string `json:"session_id,omitempty"`
	DesktopID string `json:"desktop_id,omitempty"`
	EndUserID string `json:"end_user_id,omitempty"`
	UsageTotals
}

// Report is the answer of GET /v1/usage.
type Report struct {
	Object  string       `json:"object"` // "usage"
	From    session.Time `json:"from"`
	To      session.Time `json:"to"`
	GroupBy string       `json:"group_by"`
	Totals  UsageTotals  `json:"totals"`
	Data    []UsageLine  `json:"data"`
}

// MaxReportHours bounds one report's range.
const MaxReportHours = 24 * 93

// Report sums the hourly buckets of [from, to) (whole hours, UTC) by session or end user.
func (a *Accounts) Report(ctx context.Context, project string, from, to time.Time, groupBy string) (Report, error) {
	if groupBy != "session" && groupBy != "end_user" {
		return Report{}, &session.FieldError{Field: "group_by", Message: fmt.Sprintf("must be session or end_user, got %q", groupBy)}
	}
	from, to = from.UTC().Truncate(time.Hour), to.UTC()
	if !to.After(from) {
		return Report{}, &session.FieldError{Field: "to", Message: "must be after from"}
	}
	if to.Sub(from) > MaxReportHours*time.Hour {
		return Report{}, &session.FieldError{Field: "to", Message: fmt.Sprintf("a report spans at most %d days", MaxReportHours/24)}
	}
	var cmds []*redis.MapStringStringCmd
	_, err := a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for h := from; h.Before(to); h = h.Add(time.Hour) {
			cmds = append(cmds, p.HGetAll(ctx, store.ProjectKeys(project).UsageHour(h)))
		}
		return nil
	})
	if err != nil {
		return Report{}, fmt.Errorf("usage report: %w", err)
	}
	prefix := "s:"
	if groupBy == "end_user" {
		prefix = "e:"
	}
	lines := map[string]*usageSum{}
	desks := map[string]string{} // session → its desktop
	var total usageSum
	for _, c := range cmds {
		for k, v := range c.Val() {
			if sid, ok := strings.CutPrefix(k, "sd:"); ok {
				desks[sid] = v
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			if metric, ok := strings.CutPrefix(k, "t:"); ok {
				total.add(metric, n)
				continue
			}
			rest, ok := strings.CutPrefix(k, prefix)
			if !ok {
				continue
			}
			i := strings.LastIndexByte(rest, ':')
			if i < 0 {
				continue
			}
			key, metric := rest[:i], rest[i+1:]
			l := lines[key]
			if l == nil {
				l = &usageSum{}
				lines[key] = l
			}
			l.add(metric, n)
		}
	}
	rep := Report{Object: "usage", From: *session.At(from), To: *session.At(to), GroupBy: groupBy,
		Totals: total.totals(), Data: []UsageLine{}}
	for key, l := range lines {
		line := UsageLine{UsageTotals: l.totals()}
		if groupBy == "session" {
			line.SessionID, line.DesktopID = key, desks[key]
		} else {
			line.EndUserID = key
		}
		rep.Data = append(rep.Data, line)
	}
	sort.Slice(rep.Data, func(i, j int) bool {
		return rep.Data[i].SessionID+rep.Data[i].EndUserID < rep.Data[j].SessionID+rep.Data[j].EndUserID
	})
	return rep, nil
}

// usageSum adds up the hourly buckets' metrics, in their stored units.
type usageSum struct{ ms, pausedMs, cpuMs, memGiBMs, egress, nano int64 }

func (u *usageSum) add(metric string, n int64) {
	switch metric {
	case "session_ms":
		u.ms += n
	case "paused_ms":
		u.pausedMs += n
	case "cpu_ms":
		u.cpuMs += n
	case "mem_gib_ms":
		u.memGiBMs += n
	case "egress_bytes":
		u.egress += n
	case "cost_nano":
		u.nano += n
	}
}

// totals answers the sums in the API's units (seconds, micro-USD).
func (u *usageSum) totals() UsageTotals {
	return UsageTotals{SessionS: u.ms / 1000, PausedS: u.pausedMs / 1000, CPUMs: u.cpuMs, MemGiBMs: u.memGiBMs,
		EgressBytes: u.egress, CostMicro: u.nano / 1000}
}
