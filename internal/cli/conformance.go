package cli

import (
	"fmt"
	"log/slog"
	"regexp"

	"github.com/spf13/cobra"

	"wb/conformance/suite"
)

func (a *app) conformanceCmd() *cobra.Command { return a.conformanceCmdOf(nil) }

// conformanceCmdOf is `wb conformance` checking rows (nil: every row of the suite).
func (a *app) conformanceCmdOf(rows []suite.Row) *cobra.Command {
	var long, verbose bool
	var run string
	var parallel int
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Check a deployment against every row of the seeds' tables",
		Long: `Check a deployment against the contract: every row of seed 000's tables (the session
object field by field, states and who drives each transition, pause limits per tier,
snapshots, timers and warnings, billing per state, the failure table) and seed 001's desktop
states, transitions, what is kept and what an MCP call does in each state. Each row is checked
through the Go SDK (MCP calls through the official MCP Go SDK over the SDK's HTTP client) and
printed with PASS, FAIL or SKIP and what it saw; the last line sums them up. Exits 1 when a
row fails.

It makes sessions, snapshots and desktops in the key's project (sessions with end_user_id
wbconf_…) and deletes them all at the end, a failed row's too. Give it a project of its own:
the spend-cap rows, run last and alone, set the project's monthly cap just above its spend
until a session is stopped by it, create a desktop that cannot start under it (then put the
cap back), and a cap stops every session of the project. By default the timer rows use the smallest timers the API accepts
(idle_timeout_s 30, max_lifetime_s 60: about two minutes in all); --long uses the seed's (300 s, 3600 s) and runs the rows that need real time (the
one-hour pause limit): over an hour.`,
		Example: `  wb conformance --url https://wb.example.com --key wb_...
  wb conformance --run 'Snapshots|Pause'      # only the rows whose seed/table/row matches
  wb conformance -o json | jq '.results[] | select(.status == "FAIL")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := suite.Options{Long: long, Parallel: parallel, Rows: rows}
			if run != "" {
				re, err := regexp.Compile(run)
				if err != nil {
					return fmt.Errorf("--run %q: not a regular expression: %w", run, err)
				}
				opts.Filter = re
			}
			if parallel < 1 {
				return fmt.Errorf("--parallel %d: want 1 or more rows at once", parallel)
			}
			cfg, err := resolveConfig(configInputs{
				url: a.url, apiKey: a.apiKey, profile: a.profile,
				urlSet: a.flagSet("url"), keySet: a.flagSet("api-key"), profileSet: a.flagSet("profile"),
			}, a.getenv, a.configPath())
			if err != nil {
				return err
			}
			opts.URL, opts.Key = cfg.url, cfg.apiKey
			if verbose {
				opts.Log = slog.New(slog.NewTextHandler(a.Err, nil))
			}
			rep, err := suite.Run(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.json() {
				err = writeJSON(a.Out, rep)
			} else {
				err = rep.WriteTable(a.Out)
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&long, "long", false, "use the seed's timers (idle 300 s, lifetime 3600 s) and run the rows that need them; takes over an hour")
	f.StringVar(&run, "run", "", "check only the rows whose \"seed/table/row\" matches this `regexp`")
	f.IntVar(&parallel, "parallel", 8, "check at most `n` rows at once (most of the timer rows' time is waiting)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log each row on stderr as it ends")
	// --key is the root's --api-key (normalized), as the issue spells the command.
	return cmd
}
