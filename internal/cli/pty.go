package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"wb/client"
)

// ptyCmd is `wb pty`, the short name of `wb sessions pty`.
func (a *app) ptyCmd() *cobra.Command { return a.newPTYCmd("pty") }

func (a *app) newPTYCmd(use string) *cobra.Command {
	var command string
	cmd := &cobra.Command{
		Use:   use + " SESSION_ID",
		Short: "Open an interactive terminal in a session; exit with the shell's exit code",
		Long: `Open a terminal in a running session: your terminal is put in raw mode (keys such as
Ctrl-C go to the remote shell), its size follows yours (SIGWINCH), and wb exits with the
remote shell's exit code. Without a terminal on stdin, stdin is sent as typed keys.`,
		Example: `  wb pty sess_123
  wb sessions pty sess_123 --command 'htop'`,
		Args:              exactArgs(1, "a SESSION_ID"),
		ValidArgsFunction: a.completeSessions,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.pty(cmd.Context(), c, args[0], command)
		},
	}
	cmd.Flags().StringVar(&command, "command", "", "run this under /bin/sh -c instead of an interactive /bin/sh")
	return cmd
}

func (a *app) pty(ctx context.Context, c *client.Client, id, command string) error {
	termFD := -1 // the local terminal, when stdin is one
	if f, ok := a.In.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		termFD = int(f.Fd())
	}
	req := client.PTYRequest{Command: command}
	if termFD >= 0 {
		if cols, rows, err := term.GetSize(termFD); err == nil {
			req.Cols, req.Rows = cols, rows
		}
	}
	p, err := c.OpenPTY(ctx, id, req)
	if err != nil {
		return err
	}
	defer p.Close()
	// SIGTERM (main's context) ends the terminal, so that the local one is restored.
	stopClose := context.AfterFunc(ctx, func() { _ = p.Close() })
	defer stopClose()
	if termFD >= 0 {
		old, err := term.MakeRaw(termFD)
		if err != nil {
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer term.Restore(termFD, old) //nolint:errcheck // best effort on the way out
		stopSize := followSize(termFD, func(cols, rows int) {
			_ = p.Resize(ctx, cols, rows) // a failed resize leaves the old size: not worth ending the terminal
		})
		defer stopSize()
	}
	// Keys to the guest. This read may outlive the terminal (a blocked read of stdin cannot be
	// interrupted); the process ends right after.
	go func() { _, _ = io.Copy(p, a.In) }()
	_, err = io.Copy(a.Out, p)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("pty of %s: %w", id, err)
	}
	code, ok := p.ExitCode()
	if !ok {
		return fmt.Errorf("the terminal of %s closed without an exit code", id)
	}
	return exitCode(code)
}
