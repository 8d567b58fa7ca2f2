package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"wb/client"
	"wb/plugins"
	"wb/policies"
)

func (a *app) policiesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "policies",
		Aliases: []string{"policy"},
		Short:   "Push, list, delete and test the project's Rego policies",
		Example: `  wb policies test guard.rego guard_test.rego
  wb policies test guard.rego --input request.json
  wb policies push guard.rego --mode warn
  wb policies ls
  wb policies rm guard`,
	}
	var name, mode string
	push := &cobra.Command{
		Use:   "push FILE.rego",
		Short: "Upload a new version of a policy",
		Long: `Upload FILE.rego as the next version of the policy NAME (default: the file's base name). A
module that does not compile is refused with its line and column. Sessions pin a version with
wb sessions create --policy pol_NAME@VERSION.`,
		Example: `  wb policies push guard.rego
  wb policies push ./policies/tiers.rego --name tiers --mode dryrun`,
		Args: exactArgs(1, "a FILE.rego"),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if name == "" {
				name = baseName(args[0])
			}
			p, err := c.PutPolicyMode(cmd.Context(), name, string(src), mode)
			if err != nil {
				return err
			}
			return a.print(p, policiesTable(a.now(), *p))
		},
	}
	push.Flags().StringVar(&name, "name", "", "policy `name` (default: the file's base name)")
	push.Flags().StringVar(&mode, "mode", "enforce", "`mode`: enforce, warn (deny becomes a warning) or dryrun (only logged)")
	_ = push.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{"enforce", "warn", "dryrun"}, cobra.ShellCompDirectiveNoFileComp))

	ls := &cobra.Command{
		Use:     "ls [NAME]",
		Aliases: []string{"list"},
		Short:   "List the latest version of each policy, or every version of NAME",
		Example: `  wb policies ls
  wb policies ls guard`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var l *client.List[client.Policy]
			if len(args) == 1 {
				l, err = c.GetPolicyVersions(cmd.Context(), args[0])
			} else {
				l, err = c.ListPolicies(cmd.Context())
			}
			if err != nil {
				return err
			}
			return a.print(l.Data, policiesTable(a.now(), l.Data...))
		},
	}

	rm := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete policies, every version of each",
		Long: `Delete every version of each policy NAME. A policy whose version a live session pinned is
not deleted: the API answers 409 naming the sessions; delete them or wait for them to end.`,
		Example: `  wb policies rm guard`,
		Args:    atLeastArgs(1, "one or more policy NAMEs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.deleteEach(args, func(name string) (*client.Deleted, error) {
				d, err := c.DeletePolicy(cmd.Context(), name)
				if err != nil {
					return nil, err
				}
				return &client.Deleted{ID: d.Name, Object: d.Object, Deleted: d.Deleted}, nil
			})
		},
	}

	var input string
	var timeout time.Duration
	test := &cobra.Command{
		Use:   "test FILE.rego [FILE_test.rego...] [--input INPUT.json]",
		Short: "Run a policy's Rego tests locally, or evaluate it on one input",
		Long: `Without --input, run the test rules (test_…) of the files as opa test does, but as the
platform evaluates policies: Rego v1, the platform's built-ins (no network, bounded values)
and --timeout per test. Each file not named *_test.rego is a policy and must compile as
wb policies push would have it; test files may use package wb.admission_test and import
data.wb.admission. Prints each test's result and what it printed; exits 1 when one fails.

With --input, compile FILE.rego as the platform would on upload and evaluate it on
INPUT.json, printing the package's document: deny and warn messages, defaults, kill,
allow_egress, … The input is the decision point's (see the policies package): at admission
{"request": {...}, "project_id", "plan", "active_sessions"}.

Nothing is sent to the API.`,
		Example: `  wb policies test guard.rego guard_test.rego
  wb policies test guard.rego --input admission-input.json`,
		Args: atLeastArgs(1, "a FILE.rego"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if input == "" {
				return a.testPolicies(cmd.Context(), args, timeout)
			}
			if len(args) != 1 {
				return fmt.Errorf("%s --input evaluates one FILE.rego (got %d files; without --input the files' tests run)", cmd.CommandPath(), len(args))
			}
			src, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			raw, err := os.ReadFile(input)
			if err != nil {
				return err
			}
			var in any
			if err := json.Unmarshal(raw, &in); err != nil {
				return fmt.Errorf("--input %s: %w", input, err)
			}
			ctx, cancel := contextWithTimeout(cmd, timeout)
			defer cancel()
			point, doc, err := policies.EvaluateLocal(ctx, filepath.Base(args[0]), string(src), in)
			if err != nil {
				return err
			}
			return writeJSON(a.Out, map[string]any{"point": point, "result": doc})
		},
	}
	test.Flags().StringVar(&input, "input", "", "JSON `file` of the decision's input: evaluate the policy on it (without it, the files' tests run)")
	test.Flags().DurationVar(&timeout, "timeout", time.Second, "deadline of the evaluation, or of each test")
	cmd.AddCommand(push, ls, rm, test)
	return cmd
}

// testPolicies runs the Rego tests of files (policies.RunTests) and prints their results:
// a table of each test, what failed tests printed, and a summary; -o json, the results.
func (a *app) testPolicies(ctx context.Context, files []string, perTest time.Duration) error {
	srcs := map[string]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		name := filepath.Base(f)
		if _, dup := srcs[name]; dup {
			return fmt.Errorf("two files are named %s: give files of different names", name)
		}
		srcs[name] = string(src)
	}
	res, err := policies.RunTests(ctx, srcs, perTest)
	if errors.Is(err, policies.ErrNoTests) {
		return fmt.Errorf("%s: %w; give --input INPUT.json to evaluate a policy on one input", strings.Join(files, ", "), err)
	}
	if err != nil {
		return err
	}
	failed, skipped := 0, 0
	t := table{header: []string{"RESULT", "TEST", "LOCATION", "TIME", "ERROR"}}
	for _, r := range res {
		switch r.Result {
		case "fail", "error":
			failed++
		case "skip":
			skipped++
		}
		t.rows = append(t.rows, []string{strings.ToUpper(r.Result), r.Name, r.Location, fmt.Sprintf("%.1fms", r.DurationMS), r.Error})
	}
	if err := a.print(res, t); err != nil {
		return err
	}
	if !a.json() {
		for _, r := range res {
			if r.Output != "" && (r.Result == "fail" || r.Result == "error") {
				fmt.Fprintf(a.Out, "\n%s printed:\n%s", r.Name, strings.TrimSuffix(r.Output, "\n")+"\n")
			}
		}
		summary := fmt.Sprintf("%d of %d tests passed", len(res)-failed-skipped, len(res))
		if skipped > 0 { // a skipped test (todo_test_…) did not pass
			summary += fmt.Sprintf(", %d skipped", skipped)
		}
		fmt.Fprintln(a.Out, "\n"+summary)
	}
	if failed > 0 {
		return exitCode(1)
	}
	return nil
}

func baseName(file string) string {
	return strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
}

func (a *app) pluginsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "plugins",
		Aliases: []string{"plugin"},
		Short:   "Test a Wasm plugin locally, push it to the project, list and remove plugins",
		Example: `  wb plugins test tiercap.wasm --input request.json
  wb plugins push tiercap.wasm --points admission,runtime --order 10
  wb plugins ls
  wb plugins rm tiercap`,
	}
	var (
		input, point, cfg string
		timeout           time.Duration
	)
	test := &cobra.Command{
		Use:   "test FILE.wasm --input REQUEST.json",
		Short: "Run a plugin locally on one input and print its decision and timing",
		Long: `Run FILE.wasm once, in the same host the platform uses, on INPUT: a whole decision input
(with "point"), or just a create request, wrapped as an admission input. Prints the decision
and how long the call took, as JSON.`,
		Example: `  wb plugins test tiercap.wasm --input request.json --timeout 1s
  wb plugins test guard.wasm --input runtime-event.json --config max_tier=2`,
		Args: exactArgs(1, "a FILE.wasm"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if input == "" {
				return fmt.Errorf("%s needs FILE.wasm and --input", cmd.CommandPath())
			}
			return a.pluginTest(cmd, args[0], input, point, cfg, timeout)
		},
	}
	test.Flags().StringVar(&input, "input", "", "JSON `file` of the plugin's input (the create request alone, or a whole input with \"point\")")
	test.Flags().StringVar(&point, "point", "admission", "decision `point` the input is for, when the file holds just a request")
	test.Flags().DurationVar(&timeout, "timeout", 20*time.Millisecond, "deadline of the call")
	test.Flags().StringVar(&cfg, "config", "", "plugin configuration as `k=v,k2=v2`")

	var (
		name     string
		points   []string
		order    int
		failOpen bool
	)
	push := &cobra.Command{
		Use:   "push FILE.wasm",
		Short: "Upload a plugin to the project (replacing one of the same name)",
		Example: `  wb plugins push tiercap.wasm
  wb plugins push guard.wasm --name guard --points admission,runtime --order 5 --fail-open`,
		Args: exactArgs(1, "a FILE.wasm"),
		RunE: func(cmd *cobra.Command, args []string) error {
			wasm, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if name == "" {
				name = baseName(args[0])
			}
			p, err := c.PutPlugin(cmd.Context(), name, client.PutPluginRequest{Wasm: wasm, Points: points, Order: order, FailOpen: failOpen})
			if err != nil {
				return err
			}
			return a.print(p, pluginsTable(a.now(), *p))
		},
	}
	push.Flags().StringVar(&name, "name", "", "plugin `name` (default: the file's base name)")
	push.Flags().StringSliceVar(&points, "points", []string{"admission"}, "decision `points`, comma-separated: admission, runtime, spend")
	push.Flags().IntVar(&order, "order", 0, "place in the project's chain (lower runs first)")
	push.Flags().BoolVar(&failOpen, "fail-open", false, "on a plugin failure, allow (with a warning) instead of denying")

	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the project's plugins",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.ListPlugins(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(l.Data, pluginsTable(a.now(), l.Data...))
		},
	}
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a plugin",
		Args:  exactArgs(1, "a plugin NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.GetPlugin(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.print(p, pluginsTable(a.now(), *p))
		},
	}
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Remove plugins from the project",
		Args:    atLeastArgs(1, "one or more plugin NAMEs"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.deleteEach(args, func(name string) (*client.Deleted, error) {
				d, err := c.DeletePlugin(cmd.Context(), name)
				if err != nil {
					return nil, err
				}
				return &client.Deleted{ID: d.Name, Object: d.Object, Deleted: d.Deleted}, nil
			})
		},
	}
	cmd.AddCommand(test, push, ls, get, rm)
	return cmd
}

// pluginTest is `wb plugins test`: one call of the plugin in a local host.
func (a *app) pluginTest(cmd *cobra.Command, file, input, point, cfg string, timeout time.Duration) error {
	ctx := cmd.Context()
	wasm, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(input)
	if err != nil {
		return err
	}
	var probe map[string]any
	if err := json.Unmarshal(raw, &probe); err != nil {
		return fmt.Errorf("--input %s: %w", input, err)
	}
	if _, whole := probe["point"]; !whole {
		// Just a create request: wrap it as the admission input the host would send.
		raw, _ = json.Marshal(map[string]any{"point": point, "project_id": "proj_local", "at_ms": time.Now().UnixMilli(),
			"request": probe, "plan": map[string]any{"concurrency": 100, "rate_per_sec": 100}, "active_sessions": 0})
	}
	host, err := plugins.NewHost(ctx, nil, plugins.Options{Timeout: timeout})
	if err != nil {
		return err
	}
	defer host.Close(ctx)
	var opts []plugins.Option
	if cfg != "" {
		m := map[string]string{}
		for _, kv := range strings.Split(cfg, ",") {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		opts = append(opts, plugins.WithConfig(m))
	}
	opts = append(opts, plugins.WithLimits(plugins.Limits{Timeout: timeout}))
	d, took, err := host.Call(ctx, wasm, raw, opts...)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(file), err)
	}
	return writeJSON(a.Out, map[string]any{"decision": d, "duration_us": took.Microseconds()})
}
