package cli

import (
	"context"

	"github.com/spf13/cobra"

	"wb/client"
	"wb/desktop"
)

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
