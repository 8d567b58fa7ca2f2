package cli

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"wb/client"
)

func (a *app) runsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "runs",
		Aliases: []string{"run"},
		Short:   "Run one command in a session, or ephemeral code in a fresh tier-1 session",
		Example: `  wb runs create --session sess_123 -- make test
  wb runs create --runtime python --code 'print(6*7)'
  wb runs get run_123`,
	}
	cmd.AddCommand(a.runsCreateCmd(), a.runsGetCmd())
	return cmd
}

func (a *app) runsCreateCmd() *cobra.Command {
	var (
		req      client.CreateRunRequest
		codeFile string
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "create [--session ID -- COMMAND [ARG...] | --runtime RUNTIME --code CODE]",
		Short: "Run a command and wait for its end; exit with its exit code",
		Long: `Create a run: one command in a running session (--session, then -- and the command), or
ephemeral code (--runtime with --code or --code-file) in a fresh tier-1 session made, used
once and deleted. It waits for the end and prints the run, then its stdout (and its stderr on
stderr), and exits with the run's exit code; --no-wait prints the queued run at once.`,
		Example: `  wb runs create --session sess_123 -- pytest -q
  wb runs create --runtime python --code 'print(6*7)'
  wb runs create --runtime node --code-file script.js -o json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if codeFile != "" {
				b, err := os.ReadFile(codeFile)
				if err != nil {
					return fmt.Errorf("--code-file: %w", err)
				}
				req.Code = string(b)
			}
			switch {
			case req.SessionID != "" && len(args) == 0:
				return fmt.Errorf("--session %s needs the command after -- (e.g. wb runs create --session %s -- ls)", req.SessionID, req.SessionID)
			case req.SessionID == "" && req.Code == "":
				return fmt.Errorf("give --session ID -- COMMAND, or --runtime with --code or --code-file")
			case len(args) == 1:
				req.Command = args[0]
			case len(args) > 1:
				req.Argv = args
			}
			if req.SessionID == "" {
				req.Tier = 1
			}
			req.TimeoutS = int(timeout / time.Second)
			r, err := c.CreateRun(cmd.Context(), req)
			if err != nil {
				return err
			}
			if err := a.print(r, runsTable(*r)); err != nil {
				return err
			}
			if !a.json() && (r.Stdout != "" || r.Stderr != "") {
				fmt.Fprint(a.Out, "\n", r.Stdout)
				fmt.Fprint(a.Err, r.Stderr)
			}
			if r.ExitCode != nil {
				return exitCode(*r.ExitCode)
			}
			if r.State == "failed" {
				return fmt.Errorf("run %s failed: %s", r.ID, deref(r.Error))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.SessionID, "session", "", "run in this running session")
	f.StringVar(&req.Runtime, "runtime", "", "ephemeral run's `runtime`: sh, python (python3, or python3.11 for that version), node, gcc (C source); the templates list those offered")
	f.StringVar(&req.Code, "code", "", "ephemeral run's source `code`")
	f.StringVar(&codeFile, "code-file", "", "read the ephemeral run's code from this `file`")
	f.StringVar(&req.EndUserID, "end-user", "", "your end user's `id`")
	f.StringToStringVarP(&req.Env, "env", "e", nil, "environment `NAME=value` (repeatable)")
	f.StringVar(&req.Cwd, "cwd", "", "working `directory`")
	f.DurationVar(&timeout, "timeout", 0, "kill the run after this long (default: the server's)")
	f.BoolVar(&req.NoWait, "no-wait", false, "answer at once, the run queued (see wb runs get)")
	_ = cmd.RegisterFlagCompletionFunc("session", a.completeSessions)
	return cmd
}

func (a *app) runsGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "get RUN_ID",
		Short:   "Show a run",
		Example: `  wb runs get run_123 -o json`,
		Args:    exactArgs(1, "a RUN_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			r, err := c.GetRun(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(r, runsTable(*r))
		},
	}
}

func (a *app) templatesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "templates",
		Aliases: []string{"template"},
		Short:   "List the templates sessions start from, and the runtimes ephemeral runs use",
		Example: `  wb templates ls
  wb runs create --runtime python3.11 --code 'print(6*7)'`,
	}
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the templates with their runtimes and the runtimes' versions",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(l.Data, templatesTable(l.Data...))
		},
	}
	cmd.AddCommand(ls)
	return cmd
}

func (a *app) snapshotsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshots",
		Aliases: []string{"snapshot"},
		Short:   "List and delete snapshots (take one with wb sessions snapshot)",
		Example: `  wb snapshots ls
  wb sessions create --restore-from snap_123
  wb snapshots rm snap_123`,
	}
	var limit int
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the project's snapshots, newest first",
		Example: `  wb snapshots ls`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ss, err := collect(c.AllSnapshots(cmd.Context(), client.Page{Limit: 100}), limit)
			if err != nil {
				return err
			}
			return a.print(ss, snapshotsTable(a.now(), ss...))
		},
	}
	ls.Flags().IntVar(&limit, "limit", 100, "at most this many (0: all)")
	get := &cobra.Command{
		Use:   "get SNAPSHOT_ID",
		Short: "Show a snapshot",
		Args:  exactArgs(1, "a SNAPSHOT_ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(s, snapshotsTable(a.now(), *s))
		},
	}
	rm := &cobra.Command{
		Use:     "rm SNAPSHOT_ID...",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots",
		Example: `  wb snapshots rm snap_123`,
		Args:    atLeastArgs(1, "one or more SNAPSHOT_IDs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.deleteEach(args, func(id string) (*client.Deleted, error) { return c.DeleteSnapshot(cmd.Context(), id) })
		},
	}
	cmd.AddCommand(ls, get, rm)
	return cmd
}

// deleteEach deletes ids one by one and prints what each answered.
func (a *app) deleteEach(ids []string, del func(id string) (*client.Deleted, error)) error {
	var out []client.Deleted
	for _, id := range ids {
		d, err := del(id)
		if err != nil {
			return fmt.Errorf("rm %s: %w", id, err)
		}
		out = append(out, *d)
	}
	if a.json() && len(out) == 1 {
		return writeJSON(a.Out, out[0])
	}
	return a.print(out, deletedTable(out...))
}
