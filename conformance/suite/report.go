package suite

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable prints one line per row (seed, table, row, PASS/FAIL/SKIP, what it saw) in
// aligned columns, then the summary line.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEED\tTABLE\tROW\tRESULT\tSAW")
	clean := strings.NewReplacer("\t", " ", "\n", " ")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", res.Seed, clean.Replace(res.Table), clean.Replace(res.Row), res.Status, clean.Replace(res.Saw))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range r.Leftovers {
		fmt.Fprintf(w, "LEFT BEHIND: %s\n", l)
	}
	_, err := fmt.Fprintln(w, r.Summary())
	return err
}

// Summary is the one-line outcome: counts, mode and time.
func (r Report) Summary() string {
	mode := fmt.Sprintf("short (idle_timeout_s %d, max_lifetime_s %d)", r.Timers.IdleTimeoutS, r.Timers.MaxLifetimeS)
	if r.Long {
		mode = fmt.Sprintf("long (idle_timeout_s %d, max_lifetime_s %d)", r.Timers.IdleTimeoutS, r.Timers.MaxLifetimeS)
	}
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	s := fmt.Sprintf("%s: %d passed, %d failed, %d skipped of %d rows; %s; %s", verdict, r.Passed, r.Failed, r.Skipped,
		len(r.Results), mode, r.Duration.Round(time.Second))
	if len(r.Leftovers) > 0 {
		s += fmt.Sprintf("; %d objects left behind", len(r.Leftovers))
	}
	return s
}
