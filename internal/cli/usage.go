package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"wb/client"
)

func contextWithTimeout(cmd *cobra.Command, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), d)
}

// parseWhen reads a --from/--to: RFC 3339, or a UTC date (2026-12-01) or hour (2026-12-01T15).
func parseWhen(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02T15", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("--%s %q: want RFC 3339 (2026-12-01T15:00:00Z), a date (2026-12-01) or an hour (2026-12-01T15), UTC", flag, v)
}

func (a *app) usageCmd() *cobra.Command {
	var from, to, groupBy string
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show the project's usage and cost per session or end user",
		Long: `Show settled usage and its cost over [--from, --to), in whole UTC hours (default: this month
so far), one line per session or (--group-by end_user) per end user, and the totals.`,
		Example: `  wb usage
  wb usage --from 2026-11-01 --to 2026-12-01 --group-by end_user
  wb usage -o json | jq .totals.cost_micro_usd`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := client.UsageRequest{GroupBy: groupBy}
			var err error
			if req.From, err = parseWhen("from", from); err != nil {
				return err
			}
			if req.To, err = parseWhen("to", to); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			u, err := c.GetUsage(cmd.Context(), req)
			if err != nil {
				return err
			}
			return a.print(u, usageTable(u))
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "start, inclusive (RFC 3339 or 2026-12-01)")
	cmd.Flags().StringVar(&to, "to", "", "end, exclusive (RFC 3339 or 2026-12-01)")
	cmd.Flags().StringVar(&groupBy, "group-by", "", "`session` (default) or end_user")
	_ = cmd.RegisterFlagCompletionFunc("group-by", cobra.FixedCompletions([]string{"session", "end_user"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
