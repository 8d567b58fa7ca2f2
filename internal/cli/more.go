package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"wb/client"
	"wb/desktop"
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

func (a *app) webhooksCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "webhooks",
		Aliases: []string{"webhook"},
		Short:   "Register, list and remove webhook endpoints; see their deliveries",
		Example: `  wb webhooks create https://example.com/hooks --events session.running,session.stopped
  wb webhooks ls
  wb webhooks deliveries whe_123`,
	}
	var events []string
	create := &cobra.Command{
		Use:   "create URL --events TYPE,...",
		Short: "Register an endpoint; prints its signing secret (shown only now)",
		Example: `  wb webhooks create https://example.com/hooks --events session.running,session.stopped,run.finished
  secret=$(wb webhooks create https://example.com/hooks --events session.failed -o json | jq -r .secret)`,
		Args: exactArgs(1, "the endpoint's URL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(events) == 0 {
				return fmt.Errorf("%s needs --events (e.g. session.running,session.stopped)", cmd.CommandPath())
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			e, err := c.CreateWebhookEndpoint(cmd.Context(), client.CreateWebhookEndpointRequest{URL: args[0], Events: events})
			if err != nil {
				return err
			}
			t := webhooksTable(a.now(), e.WebhookEndpoint)
			t.header = append(t.header, "SECRET")
			t.rows[0] = append(t.rows[0], e.Secret)
			return a.print(e, t)
		},
	}
	create.Flags().StringSliceVar(&events, "events", nil, "event `types`, comma-separated: session.pending, session.running, session.stopped, run.finished, …")
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the project's endpoints",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.ListWebhookEndpoints(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(l.Data, webhooksTable(a.now(), l.Data...))
		},
	}
	get := &cobra.Command{
		Use:   "get ENDPOINT_ID",
		Short: "Show an endpoint",
		Args:  exactArgs(1, "an ENDPOINT_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			e, err := c.GetWebhookEndpoint(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(e, webhooksTable(a.now(), *e))
		},
	}
	rm := &cobra.Command{
		Use:     "rm ENDPOINT_ID...",
		Aliases: []string{"delete"},
		Short:   "Remove endpoints",
		Args:    atLeastArgs(1, "one or more ENDPOINT_IDs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.deleteEach(args, func(id string) (*client.Deleted, error) { return c.DeleteWebhookEndpoint(cmd.Context(), id) })
		},
	}
	var limit int
	deliveries := &cobra.Command{
		Use:     "deliveries ENDPOINT_ID",
		Short:   "List an endpoint's delivery attempts, newest first",
		Example: `  wb webhooks deliveries whe_123 --limit 20`,
		Args:    exactArgs(1, "an ENDPOINT_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.ListWebhookDeliveries(cmd.Context(), args[0], client.Page{Limit: limit})
			if err != nil {
				return err
			}
			return a.print(l.Data, deliveriesTable(a.now(), l.Data...))
		},
	}
	deliveries.Flags().IntVar(&limit, "limit", 50, "at most this many (1–100)")
	cmd.AddCommand(create, ls, get, rm, deliveries)
	return cmd
}

func (a *app) desktopsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "desktops",
		Aliases: []string{"desktop"},
		Short:   "Long-lived desktops that sleep when unused and wake when asked",
		Example: `  wb desktops create research --size m
  wb desktops ls
  wb desktops sleep desk_123
  wb desktops resize desk_123 l`,
	}
	var size string
	create := &cobra.Command{
		Use:     "create NAME",
		Short:   "Create a desktop (it answers starting)",
		Example: `  wb desktops create research --size m`,
		Args:    exactArgs(1, "a NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			d, err := c.CreateDesktop(cmd.Context(), client.CreateDesktopRequest{Name: args[0], Size: desktop.Size(size)})
			if err != nil {
				return err
			}
			return a.print(d, desktopsTable(a.now(), *d))
		},
	}
	create.Flags().StringVar(&size, "size", "", "`size` s, m, l or xl (default: the smallest)")
	var limit int
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the project's desktops (listing keeps none awake)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ds, err := collect(c.AllDesktops(cmd.Context(), client.Page{Limit: 100}), limit)
			if err != nil {
				return err
			}
			return a.print(ds, desktopsTable(a.now(), ds...))
		},
	}
	ls.Flags().IntVar(&limit, "limit", 100, "at most this many (0: all)")
	resize := &cobra.Command{
		Use:   "resize DESKTOP_ID SIZE",
		Short: "Change a desktop's size (an awake one takes it at its next start)",
		Args:  exactArgs(2, "a DESKTOP_ID", "a SIZE (s, m, l, xl)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			d, err := c.ResizeDesktop(cmd.Context(), args[0], client.ResizeDesktopRequest{Size: desktop.Size(args[1])})
			if err != nil {
				return err
			}
			return a.print(d, desktopsTable(a.now(), *d))
		},
	}
	rm := &cobra.Command{
		Use:     "rm DESKTOP_ID...",
		Aliases: []string{"delete"},
		Short:   "Delete desktops with their disks and saved state",
		Args:    atLeastArgs(1, "one or more DESKTOP_IDs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.deleteEach(args, func(id string) (*client.Deleted, error) { return c.DeleteDesktop(cmd.Context(), id) })
		},
	}
	cmd.AddCommand(create, ls, resize, rm,
		a.desktopActionCmd("get", "Show a desktop", (*client.Client).GetDesktop),
		a.desktopActionCmd("sleep", "Save a running desktop's state and stop it", (*client.Client).SleepDesktop),
		a.desktopActionCmd("wake", "Start an asleep desktop from its saved state", (*client.Client).WakeDesktop),
		a.desktopActionCmd("stop", "Stop a desktop, keeping its disk only", (*client.Client).StopDesktop),
		a.desktopActionCmd("start", "Start a stopped desktop fresh from its disk", (*client.Client).StartDesktop))
	return cmd
}

func (a *app) desktopActionCmd(name, short string, call func(*client.Client, context.Context, string) (*client.Desktop, error)) *cobra.Command {
	return &cobra.Command{
		Use:     name + " DESKTOP_ID",
		Short:   short,
		Example: "  wb desktops " + name + " desk_123",
		Args:    exactArgs(1, "a DESKTOP_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			d, err := call(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(d, desktopsTable(a.now(), *d))
		},
	}
}
