package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"wb/client"
)

// table is what a command prints by default: a header and rows, in aligned columns.
type table struct {
	header []string
	rows   [][]string
}

func (t table) render(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	for _, r := range t.rows {
		cells := make([]string, len(r))
		for i, c := range r {
			// A tab or newline in a value would break the columns.
			cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(c)
			if cells[i] == "" {
				cells[i] = "-"
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// age says how long ago t was, in the largest whole unit: 42s, 5m, 3h, 2d.
func age(now time.Time, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func timeOf(t *client.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

// templateName drops the digest of name@sha256:…: the table has no room for it.
func templateName(t string) string {
	name, _, _ := strings.Cut(t, "@")
	return name
}

// bytesText is a size in B, KiB, MiB or GiB.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 2; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%s", float64(n)/float64(div), []string{"KiB", "MiB", "GiB"}[exp])
}

// usd is micro-USD as dollars with six decimals (never a float's rounding).
func usd(micro int64) string {
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	return fmt.Sprintf("%s$%d.%06d", sign, micro/1_000_000, micro%1_000_000)
}

func sessionsTable(now time.Time, ss ...client.Session) table {
	t := table{header: []string{"ID", "TIER", "STATE", "TEMPLATE", "END USER", "AGE", "REASON"}}
	for _, s := range ss {
		reason := ""
		if s.StateReason != nil {
			reason = string(*s.StateReason)
			if s.Rule != nil {
				reason += " (" + *s.Rule + ")"
			}
		}
		t.rows = append(t.rows, []string{s.ID, strconv.Itoa(s.Tier), string(s.State), templateName(s.Template),
			deref(s.EndUserID), age(now, s.CreatedAt.Time), reason})
	}
	return t
}

func snapshotsTable(now time.Time, ss ...client.Snapshot) table {
	t := table{header: []string{"ID", "SESSION", "STATE", "MEMORY", "SIZE", "AGE"}}
	for _, s := range ss {
		t.rows = append(t.rows, []string{s.ID, s.SessionID, s.State, strconv.FormatBool(s.IncludeMemory),
			bytesText(s.SizeBytes), age(now, s.CreatedAt.Time)})
	}
	return t
}

// templatesTable shows each template's runtimes with their versions: "python3 3.11.2".
func templatesTable(ts ...client.Template) table {
	t := table{header: []string{"NAME", "DIGEST", "RUNTIMES", "DEFAULT SIZE"}}
	for _, tp := range ts {
		rts := make([]string, len(tp.Runtimes))
		for i, r := range tp.Runtimes {
			rts[i] = r
			if v := tp.RuntimeVersions[r]; v != "" {
				rts[i] += " " + v
			}
		}
		digest := tp.Digest
		if len(digest) > len("sha256:")+12 {
			digest = digest[:len("sha256:")+12]
		}
		t.rows = append(t.rows, []string{tp.Name, digest, strings.Join(rts, ", "), tp.DefaultResources.SizeClass})
	}
	return t
}

func runsTable(rs ...client.Run) table {
	t := table{header: []string{"ID", "SESSION", "STATE", "EXIT", "DURATION"}}
	for _, r := range rs {
		exit, dur := "", ""
		if r.ExitCode != nil {
			exit = strconv.Itoa(*r.ExitCode)
		}
		if r.DurationMs != nil {
			dur = (time.Duration(*r.DurationMs) * time.Millisecond).String()
		}
		t.rows = append(t.rows, []string{r.ID, deref(r.SessionID), r.State, exit, dur})
	}
	return t
}

func policiesTable(now time.Time, ps ...client.Policy) table {
	t := table{header: []string{"ID", "NAME", "VERSION", "MODE", "POINT", "AGE"}}
	for _, p := range ps {
		t.rows = append(t.rows, []string{p.ID, p.Name, strconv.Itoa(p.Version), p.Mode, p.Point, age(now, p.CreatedAt.Time)})
	}
	return t
}

func pluginsTable(now time.Time, ps ...client.Plugin) table {
	t := table{header: []string{"NAME", "POINTS", "ORDER", "FAIL OPEN", "SIZE", "DIGEST", "AGE"}}
	for _, p := range ps {
		digest := p.Digest
		if len(digest) > 19 { // sha256: and 12 hex digits, as docker shows
			digest = digest[:19]
		}
		t.rows = append(t.rows, []string{p.Name, strings.Join(p.Points, ","), strconv.Itoa(p.Order), strconv.FormatBool(p.FailOpen),
			bytesText(int64(p.SizeBytes)), digest, age(now, p.CreatedAt.Time)})
	}
	return t
}

func webhooksTable(now time.Time, es ...client.WebhookEndpoint) table {
	t := table{header: []string{"ID", "URL", "EVENTS", "AGE"}}
	for _, e := range es {
		t.rows = append(t.rows, []string{e.ID, e.URL, strings.Join(e.Events, ","), age(now, e.CreatedAt.Time)})
	}
	return t
}

func deliveriesTable(now time.Time, ds ...client.WebhookDelivery) table {
	t := table{header: []string{"ID", "EVENT", "TYPE", "STATUS", "ATTEMPT", "RESPONSE", "ERROR", "AGE"}}
	for _, d := range ds {
		resp := ""
		if d.ResponseStatus != 0 {
			resp = strconv.Itoa(d.ResponseStatus)
		}
		t.rows = append(t.rows, []string{d.ID, d.EventID, d.EventType, d.Status, strconv.Itoa(d.Attempt), resp, deref(d.Error), age(now, d.CreatedAt.Time)})
	}
	return t
}

func desktopsTable(now time.Time, ds ...client.Desktop) table {
	t := table{header: []string{"ID", "NAME", "SIZE", "STATE", "SESSION", "LAST USED", "AGE"}}
	for _, d := range ds {
		size := string(d.Size)
		if d.NextSize != "" {
			size += "→" + string(d.NextSize)
		}
		t.rows = append(t.rows, []string{d.ID, d.Name, size, string(d.State), d.SessionID, age(now, timeOf(d.LastUsedAt)), age(now, d.CreatedAt.Time)})
	}
	return t
}

func usageTable(u *client.Usage) table {
	key := "SESSION"
	if u.GroupBy == "end_user" {
		key = "END USER"
	}
	t := table{header: []string{key, "SESSION S", "PAUSED S", "CPU MS", "MEM GIB·MS", "EGRESS", "COST"}}
	line := func(name string, v client.UsageTotals) []string {
		return []string{name, strconv.FormatInt(v.SessionS, 10), strconv.FormatInt(v.PausedS, 10), strconv.FormatInt(v.CPUMs, 10),
			strconv.FormatInt(v.MemGiBMs, 10), bytesText(v.EgressBytes), usd(v.CostMicroUSD)}
	}
	for _, l := range u.Data {
		name := l.SessionID
		if u.GroupBy == "end_user" {
			name = l.EndUserID
		}
		t.rows = append(t.rows, line(name, l.UsageTotals))
	}
	t.rows = append(t.rows, line("TOTAL", u.Totals))
	return t
}

func deletedTable(ds ...client.Deleted) table {
	t := table{header: []string{"ID", "OBJECT", "DELETED"}}
	for _, d := range ds {
		t.rows = append(t.rows, []string{d.ID, d.Object, strconv.FormatBool(d.Deleted)})
	}
	return t
}
