package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"wb/client"
)

// Streams are the command's standard streams. In is read by `exec --stdin` and `pty`; a
// terminal on In (an *os.File) makes `pty` interactive, and a terminal on Err shows progress.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// ExitError ends the CLI with Code: the exit code of a remote command (exec, pty, runs), or
// 124 for one that timed out. Err, when set, says why.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

func (e *ExitError) Unwrap() error { return e.Err }

// exitCode is nil for 0, else an *ExitError carrying code (clamped to 1–255, what a process
// can exit with).
func exitCode(code int) error {
	if code == 0 {
		return nil
	}
	if code < 0 || code > 255 {
		code = 1
	}
	return &ExitError{Code: code}
}

// Handles reports whether the top-level command name is one of this package's (cobra's
// __complete included: the completion scripts call it).
func Handles(name string) bool {
	switch name {
	case "sessions", "session", "runs", "run", "snapshots", "snapshot", "policies", "policy", "plugins", "plugin",
		"usage", "webhooks", "webhook", "desktops", "desktop", "pty", "completion", "conformance",
		cobra.ShellCompRequestCmd, cobra.ShellCompNoDescRequestCmd:
		return true
	}
	return false
}

// app is one invocation: its streams, configuration flags and the client they make.
type app struct {
	Streams
	getenv   func(string) string
	now      func() time.Time
	progress bool // stderr is a terminal: show progress there

	url, apiKey, profile, output string
	root                         *cobra.Command
}

// Run runs one CLI command: args without the program name, e.g. ["sessions", "ls"].
func Run(ctx context.Context, args []string, s Streams) error {
	a := &app{Streams: s, getenv: os.Getenv, now: time.Now, progress: isTerminal(s.Err)}
	return a.run(ctx, args)
}

func (a *app) run(ctx context.Context, args []string) error {
	root := a.newRoot()
	root.SetArgs(args)
	root.SetIn(a.In)
	root.SetOut(a.Out)
	root.SetErr(a.Err)
	err := root.ExecuteContext(ctx)
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		return apiError{apiErr}
	}
	return err
}

// apiError says an API error as the CLI shows it: the API's message, its param, its type and
// status.
type apiError struct{ e *client.Error }

func (e apiError) Error() string {
	s := e.e.Message
	if e.e.Param != "" {
		s += " (param " + e.e.Param + ")"
	}
	return fmt.Sprintf("%s [%d %s/%s]", s, e.e.Status, e.e.Type, e.e.Code)
}

func (e apiError) Unwrap() error { return e.e }

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (a *app) newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "wb",
		Short: "wb — agent sandboxes from the command line",
		Long: `wb calls a wb deployment's API (/v1) with a project's API key.

Configuration, first found wins: --url and --api-key; the profile --profile names in the
profile file; WB_URL and WB_API_KEY; the profile WB_PROFILE names (default "default").
The profile file is $WB_CONFIG, else ~/.config/wb/config:

  [default]
  url = https://wb.example.com
  api_key = wb_...

Output is a table; -o json prints the API's objects. Errors exit 2; exec, pty and runs exit
with the remote command's code.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.url, "url", "", "API base `URL`, e.g. https://wb.example.com (default $WB_URL or the profile's url)")
	pf.StringVar(&a.apiKey, "api-key", "", "project API `key` (default $WB_API_KEY or the profile's api_key)")
	pf.StringVar(&a.profile, "profile", "", "`name` of a profile in the profile file (default $WB_PROFILE, else \"default\")")
	pf.StringVarP(&a.output, "output", "o", "table", "output `format`: table or json")
	// --key was `wb plugins push`'s name for the API key: still accepted.
	root.SetGlobalNormalizationFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "key" {
			name = "api-key"
		}
		return pflag.NormalizedName(name)
	})
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
	_ = root.RegisterFlagCompletionFunc("profile", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		names, _ := profileNames(a.configPath())
		return names, cobra.ShellCompDirectiveNoFileComp
	})
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if a.output != "table" && a.output != "json" {
			return fmt.Errorf("--output %q: want table or json", a.output)
		}
		return nil
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (run %q for its flags)", err, cmd.CommandPath()+" --help")
	})
	root.AddCommand(a.sessionsCmd(), a.ptyCmd(), a.runsCmd(), a.templatesCmd(), a.snapshotsCmd(), a.policiesCmd(), a.pluginsCmd(),
		a.usageCmd(), a.webhooksCmd(), a.desktopsCmd(), a.conformanceCmd())
	a.root = root
	return root
}

// client makes the API client from the resolved configuration.
func (a *app) client() (*client.Client, error) {
	cfg, err := resolveConfig(configInputs{
		url: a.url, apiKey: a.apiKey, profile: a.profile,
		urlSet: a.flagSet("url"), keySet: a.flagSet("api-key"), profileSet: a.flagSet("profile"),
	}, a.getenv, a.configPath())
	if err != nil {
		return nil, err
	}
	return client.New(cfg.url, cfg.apiKey, client.WithUserAgent("wb-cli"))
}

func (a *app) flagSet(name string) bool {
	f := a.root.PersistentFlags().Lookup(name)
	return f != nil && f.Changed
}

// configPath is the profile file: $WB_CONFIG, else ~/.config/wb/config (XDG_CONFIG_HOME),
// the home being $HOME, or on Windows, which sets none, %USERPROFILE%.
func (a *app) configPath() string {
	if p := a.getenv("WB_CONFIG"); p != "" {
		return p
	}
	if x := a.getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "wb", "config")
	}
	for _, home := range []string{"HOME", "USERPROFILE"} {
		if h := a.getenv(home); h != "" {
			return filepath.Join(h, ".config", "wb", "config")
		}
	}
	return ""
}

// json reports whether -o json was asked for.
func (a *app) json() bool { return a.output == "json" }

// print writes v as the API's JSON with -o json, else as the table t.
func (a *app) print(v any, t table) error {
	if a.json() {
		return writeJSON(a.Out, v)
	}
	return t.render(a.Out)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// collect walks a paginated list up to limit items (0: all).
func collect[T any](seq func(yield func(T, error) bool), limit int) ([]T, error) {
	out := []T{}
	for v, err := range seq {
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out, nil
}

// exactArgs is cobra.ExactArgs with a message that names what is missing.
func exactArgs(n int, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%s needs %s (got %d arguments; see --help)", cmd.CommandPath(), strings.Join(names, " and "), len(args))
		}
		return nil
	}
}

// atLeastArgs requires n or more arguments, naming them.
func atLeastArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return fmt.Errorf("%s needs %s (see --help)", cmd.CommandPath(), what)
		}
		return nil
	}
}
