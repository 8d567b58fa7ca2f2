package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"wb/client"
)

func (a *app) sessionsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sessions",
		Aliases: []string{"session"},
		Short:   "Create, list, use and stop sessions (isolated guests)",
		Example: `  wb sessions create --tier 2 --template tpl_dev_polyglot
  wb sessions ls --state running
  wb sessions exec sess_123 -- python3 -c 'print(6*7)'
  wb sessions pty sess_123
  wb sessions snapshot sess_123 --memory
  wb sessions rm sess_123`,
	}
	cmd.AddCommand(a.sessionsCreateCmd(), a.sessionsListCmd(), a.sessionsGetCmd(), a.execCmd(), a.newPTYCmd("pty"),
		a.sessionActionCmd("pause", "Pause a running session (tier 2 and up); billing drops to the paused rate", (*client.Client).PauseSession),
		a.sessionActionCmd("resume", "Resume a paused session", (*client.Client).ResumeSession),
		a.snapshotCmd(), a.sessionsRmCmd())
	return cmd
}

// completeSessions completes the first argument with the project's live session ids.
func (a *app) completeSessions(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
	defer cancel()
	var out []cobra.Completion
	for s, err := range c.AllSessions(ctx, client.ListSessionsRequest{Page: client.Page{Limit: 100}}) {
		if err != nil || len(out) >= 200 {
			break
		}
		if !s.State.Terminal() {
			out = append(out, cobra.CompletionWithDesc(s.ID, string(s.State)+" "+templateName(s.Template)))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) sessionsCreateCmd() *cobra.Command {
	var (
		req                     client.CreateSessionRequest
		size                    string
		vcpu, memMiB, diskGiB   int
		idle, lifetime, waitFor time.Duration
		noWait                  bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a session and wait until it runs",
		Long: `Create a session. It waits until the session is running (progress on stderr when stderr is
a terminal) unless --no-wait; a session that fails to start is an error naming why.`,
		Example: `  wb sessions create --tier 2
  wb sessions create --tier 3 --template tpl_dev_polyglot --size m --idle-timeout 10m -m team=search
  wb sessions create --restore-from snap_123
  id=$(wb sessions create -o json | jq -r .id)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if size != "" || vcpu != 0 || memMiB != 0 || diskGiB != 0 {
				req.Resources = &client.ResourceRequest{SizeClass: size, VCPU: nonZero(vcpu), MemoryMiB: nonZero(memMiB), DiskGiB: nonZero(diskGiB)}
			}
			req.IdleTimeoutS, req.MaxLifetimeS = int(idle/time.Second), int(lifetime/time.Second)
			s, err := c.CreateSession(cmd.Context(), req)
			if err != nil {
				return err
			}
			if !noWait {
				if s, err = a.awaitRunning(cmd.Context(), c, s, waitFor); err != nil {
					return err
				}
			}
			return a.print(s, sessionsTable(a.now(), *s))
		},
	}
	f := cmd.Flags()
	f.IntVar(&req.Tier, "tier", 2, "isolation `tier` 1–4 (1: ephemeral, no pause)")
	f.StringVar(&req.Template, "template", "", "template `name`, e.g. tpl_base or tpl_dev_polyglot (default: the server's)")
	f.StringVar(&req.Region, "region", "", "`region` to run in")
	f.StringVar(&size, "size", "", "resource size `class` (s, m, l, xl)")
	f.IntVar(&vcpu, "vcpu", 0, "vCPUs (instead of --size)")
	f.IntVar(&memMiB, "memory-mib", 0, "memory in MiB (instead of --size)")
	f.IntVar(&diskGiB, "disk-gib", 0, "disk in GiB (instead of --size)")
	f.DurationVar(&idle, "idle-timeout", 0, "stop after this long without activity, e.g. 10m (default: the tier's)")
	f.DurationVar(&lifetime, "max-lifetime", 0, "stop this long after start, e.g. 2h (default: the tier's)")
	f.StringVar(&req.EndUserID, "end-user", "", "your end user's `id`, for per-user caps and usage")
	f.StringVar(&req.PolicyID, "policy", "", "pin a policy version, e.g. pol_guard@3")
	f.StringVar(&req.VolumeID, "volume", "", "volume `id` to attach")
	f.StringVar(&req.RestoreFrom, "restore-from", "", "a ready snapshot's `id` to start from")
	f.StringToStringVarP(&req.Metadata, "metadata", "m", nil, "metadata `key=value` (repeatable)")
	f.BoolVar(&noWait, "no-wait", false, "answer at once, the session pending")
	f.DurationVar(&waitFor, "wait-timeout", 5*time.Minute, "how long to wait for running")
	return cmd
}

// awaitRunning polls the session until it runs, showing its state on a terminal's stderr.
func (a *app) awaitRunning(ctx context.Context, c *client.Client, s *client.Session, timeout time.Duration) (*client.Session, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := a.newProgress()
	defer p.done()
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, time.Second) {
		p.show(fmt.Sprintf("%s: %s", s.ID, s.State))
		switch {
		case s.State == "running":
			return s, nil
		case s.State.Terminal():
			why := ""
			if s.StateReason != nil {
				why = " (" + string(*s.StateReason) + ")"
			}
			return s, fmt.Errorf("session %s is %s%s: it will not run", s.ID, s.State, why)
		}
		if err := sleepCtx(ctx, delay); err != nil {
			return s, fmt.Errorf("session %s still %s after %v (--wait-timeout): %w", s.ID, s.State, timeout, err)
		}
		next, err := c.GetSession(ctx, s.ID)
		if err != nil {
			return s, err
		}
		s = next
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (a *app) sessionsListCmd() *cobra.Command {
	var (
		req   client.ListSessionsRequest
		state string
		limit int
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the project's sessions, newest first",
		Example: `  wb sessions ls
  wb sessions ls --state running --end-user alice
  wb sessions ls -o json | jq -r '.[].id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			req.State = client.SessionState(state)
			req.Limit = 100
			ss, err := collect(c.AllSessions(cmd.Context(), req), limit)
			if err != nil {
				return err
			}
			return a.print(ss, sessionsTable(a.now(), ss...))
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only sessions in this `state` (pending, running, paused, stopped, failed, …)")
	cmd.Flags().StringVar(&req.EndUserID, "end-user", "", "only this end user's sessions")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many (0: all)")
	return cmd
}

func (a *app) sessionsGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "get SESSION_ID",
		Short:             "Show a session",
		Example:           `  wb sessions get sess_123 -o json`,
		Args:              exactArgs(1, "a SESSION_ID"),
		ValidArgsFunction: a.completeSessions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := c.GetSession(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(s, sessionsTable(a.now(), *s))
		},
	}
}

func (a *app) sessionActionCmd(name, short string, call func(*client.Client, context.Context, string) (*client.Session, error)) *cobra.Command {
	return &cobra.Command{
		Use:               name + " SESSION_ID",
		Short:             short,
		Example:           "  wb sessions " + name + " sess_123",
		Args:              exactArgs(1, "a SESSION_ID"),
		ValidArgsFunction: a.completeSessions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			s, err := call(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(s, sessionsTable(a.now(), *s))
		},
	}
}

func (a *app) sessionsRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm SESSION_ID...",
		Aliases: []string{"delete", "stop"},
		Short:   "Stop and delete sessions",
		Long: `Stop sessions; each answers in stopping (or as it is, once stopped). With -o json one id prints
the session object, several an array of them.`,
		Example:           `  wb sessions rm sess_123 sess_456`,
		Args:              atLeastArgs(1, "one or more SESSION_IDs"),
		ValidArgsFunction: a.completeSessions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var out []client.Session
			for _, id := range args {
				s, err := c.DeleteSession(cmd.Context(), id)
				if err != nil {
					return fmt.Errorf("rm %s: %w", id, err)
				}
				out = append(out, *s)
			}
			if a.json() && len(out) == 1 {
				return writeJSON(a.Out, out[0])
			}
			return a.print(out, sessionsTable(a.now(), out...))
		},
	}
}

func (a *app) snapshotCmd() *cobra.Command {
	var (
		memory, noWait bool
		waitFor        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "snapshot SESSION_ID",
		Short: "Snapshot a running session and wait until the snapshot is ready",
		Long: `Snapshot a running session (it passes through snapshotting and returns to running) and wait
until the snapshot is ready, with progress on a terminal's stderr, unless --no-wait. Start a
new session from it with: wb sessions create --restore-from SNAPSHOT_ID.`,
		Example: `  wb sessions snapshot sess_123
  wb sessions snapshot sess_123 --memory
  snap=$(wb sessions snapshot sess_123 -o json | jq -r .id)`,
		Args:              exactArgs(1, "a SESSION_ID"),
		ValidArgsFunction: a.completeSessions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), waitFor)
			defer cancel()
			p := a.newProgress()
			defer p.done()
			p.show(fmt.Sprintf("%s: snapshotting", args[0]))
			snap, err := c.SnapshotSession(ctx, args[0], client.SnapshotRequest{IncludeMemory: memory})
			if err != nil {
				return err
			}
			for delay := 100 * time.Millisecond; !noWait && snap.State == "creating"; delay = min(delay*2, time.Second) {
				p.show(fmt.Sprintf("%s: %s %s", args[0], snap.ID, snap.State))
				if err := sleepCtx(ctx, delay); err != nil {
					return fmt.Errorf("snapshot %s still %s after %v (--wait-timeout): %w", snap.ID, snap.State, waitFor, err)
				}
				if snap, err = c.GetSnapshot(ctx, snap.ID); err != nil {
					return err
				}
			}
			p.show(fmt.Sprintf("%s: %s %s", args[0], snap.ID, snap.State))
			p.done()
			if snap.State == "failed" {
				return fmt.Errorf("snapshot %s of %s failed", snap.ID, args[0])
			}
			return a.print(snap, snapshotsTable(a.now(), *snap))
		},
	}
	cmd.Flags().BoolVar(&memory, "memory", false, "include the memory (processes resume where they were, where the back end can)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "answer at once, the snapshot maybe still creating")
	cmd.Flags().DurationVar(&waitFor, "wait-timeout", 10*time.Minute, "how long to wait for the snapshot")
	return cmd
}

func (a *app) execCmd() *cobra.Command {
	var (
		req       client.ExecRequest
		timeout   time.Duration
		readStdin bool
	)
	cmd := &cobra.Command{
		Use:   "exec SESSION_ID -- COMMAND [ARG...]",
		Short: "Run a command in a session, streaming its output; exit with its exit code",
		Long: `Run one command in a running session. Its stdout and stderr stream to yours as they come,
and wb exits with the command's exit code (124 when it timed out). One argument after -- is
run by /bin/sh -c; several are an argv, run as given. With -o json the whole result object is
printed once the command ends.`,
		Example: `  wb sessions exec sess_123 -- ls -la /workspace
  wb sessions exec sess_123 -- 'cd /workspace && make test'
  echo hello | wb sessions exec sess_123 --stdin -- cat
  wb sessions exec sess_123 --env DEBUG=1 --cwd /workspace --timeout 10m -- ./build.sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 || cmd.ArgsLenAtDash() != 1 {
				return fmt.Errorf("%s needs a SESSION_ID, then -- and the command (e.g. wb sessions exec sess_123 -- ls)", cmd.CommandPath())
			}
			return nil
		},
		ValidArgsFunction: a.completeSessions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			id, argv := args[0], args[1:]
			if len(argv) == 1 {
				req.Command = argv[0]
			} else {
				req.Argv = argv
			}
			req.TimeoutS = int(timeout / time.Second)
			if readStdin {
				b, err := io.ReadAll(a.In)
				if err != nil {
					return fmt.Errorf("read stdin for --stdin: %w", err)
				}
				req.Stdin = string(b)
			}
			return a.exec(cmd.Context(), c, id, req)
		},
	}
	f := cmd.Flags()
	f.StringToStringVarP(&req.Env, "env", "e", nil, "environment `NAME=value` (repeatable)")
	f.StringVar(&req.Cwd, "cwd", "", "working `directory`")
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long, 1s–1h (default: the server's 60s)")
	f.BoolVarP(&readStdin, "stdin", "i", false, "send this process's stdin (read to its end first) as the command's")
	return cmd
}

func (a *app) exec(ctx context.Context, c *client.Client, id string, req client.ExecRequest) error {
	if a.json() {
		r, err := c.ExecCollect(ctx, id, req)
		if err != nil {
			return err
		}
		if err := writeJSON(a.Out, r); err != nil {
			return err
		}
		return execEnd(r.ExitCode, r.TimedOut, r.DurationMs)
	}
	for ev, err := range c.ExecStream(ctx, id, req) {
		if err != nil {
			return err
		}
		switch {
		case ev.End != nil:
			return execEnd(ev.End.ExitCode, ev.End.TimedOut, ev.End.DurationMs)
		case ev.Stream == "stderr":
			_, _ = a.Err.Write(ev.Data)
		default:
			if _, err := a.Out.Write(ev.Data); err != nil {
				return fmt.Errorf("write the command's output: %w", err)
			}
		}
	}
	return nil
}

// execEnd is the CLI's end for a remote command's: its exit code, or 124 (timeout(1)'s) with a
// message when it timed out.
func execEnd(code int, timedOut bool, ms int64) error {
	if timedOut {
		return &ExitError{Code: 124, Err: fmt.Errorf("the command timed out after %v (raise --timeout)", time.Duration(ms)*time.Millisecond)}
	}
	return exitCode(code)
}

// progress shows one changing status line on stderr while something is awaited, only when
// stderr is a terminal (a pipe or a log gets nothing).
type progress struct {
	w       io.Writer
	on      bool
	start   time.Time
	printed bool
}

func (a *app) newProgress() *progress { return &progress{w: a.Err, on: a.progress, start: time.Now()} }

func (p *progress) show(msg string) {
	if !p.on {
		return
	}
	// \r and erase-line: the line is rewritten in place.
	fmt.Fprintf(p.w, "\r\x1b[K%s (%.1fs)", msg, time.Since(p.start).Seconds())
	p.printed = true
}

// done ends the status line; idempotent.
func (p *progress) done() {
	if p.on && p.printed {
		fmt.Fprintln(p.w)
		p.printed = false
	}
}

// nonZero is nil for 0 (the field left out), else &n.
func nonZero(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}
