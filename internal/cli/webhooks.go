package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"wb/client"
)

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
