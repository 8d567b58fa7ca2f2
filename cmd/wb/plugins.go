package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"wb/plugins"
)

const pluginsUsage = `Usage:
  wb plugins test FILE.wasm --input request.json [--point admission] [--timeout 20ms] [--config k=v,...]
      run a plugin locally on one input and print its decision and timing
  wb plugins push FILE.wasm [--name NAME] [--points admission,runtime] [--order N] [--fail-open]
      upload a plugin to the project of $WB_API_KEY at $WB_URL (or --url, --key)
`

// pluginsCmd is `wb plugins …`, the tools of plugin authors.
func pluginsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, pluginsUsage)
		if len(args) == 0 {
			return errors.New("wb plugins needs test or push")
		}
		return nil
	}
	switch args[0] {
	case "test":
		return pluginsTest(ctx, args[1:], stdout, stderr)
	case "push":
		return pluginsPush(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, pluginsUsage)
	return fmt.Errorf("unknown plugins command %q", args[0])
}

// splitFile pulls the one positional FILE out of args, wherever it stands.
func splitFile(args []string) (string, []string) {
	var rest []string
	file := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			rest = append(rest, a)
			if !strings.Contains(a, "=") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && a != "--fail-open" && a != "-fail-open" {
				rest = append(rest, args[i+1])
				i++
			}
			continue
		}
		if file == "" {
			file = a
			continue
		}
		rest = append(rest, a)
	}
	return file, rest
}

func pluginsTest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	file, rest := splitFile(args)
	fs := flag.NewFlagSet("wb plugins test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	input := fs.String("input", "", "JSON `file` of the plugin's input (the create request alone, or a whole input with \"point\")")
	point := fs.String("point", "admission", "decision `point` the input is for, when the file holds just a request")
	timeout := fs.Duration("timeout", 20*time.Millisecond, "deadline of the call")
	cfg := fs.String("config", "", "plugin configuration as `k=v,k2=v2`")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if file == "" || *input == "" {
		fmt.Fprint(stderr, pluginsUsage)
		return errors.New("wb plugins test needs FILE.wasm and --input")
	}
	wasm, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(*input)
	if err != nil {
		return err
	}
	var probe map[string]any
	if err := json.Unmarshal(raw, &probe); err != nil {
		return fmt.Errorf("--input %s: %w", *input, err)
	}
	if _, whole := probe["point"]; !whole {
		// Just a create request: wrap it as the admission input the host would send.
		raw, _ = json.Marshal(map[string]any{"point": *point, "project_id": "proj_local", "at_ms": time.Now().UnixMilli(),
			"request": probe, "plan": map[string]any{"concurrency": 100, "rate_per_sec": 100}, "active_sessions": 0})
	}
	host, err := plugins.NewHost(ctx, nil, plugins.Options{Timeout: *timeout})
	if err != nil {
		return err
	}
	defer host.Close(ctx)
	var opts []plugins.Option
	if *cfg != "" {
		m := map[string]string{}
		for _, kv := range strings.Split(*cfg, ",") {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		opts = append(opts, plugins.WithConfig(m))
	}
	opts = append(opts, plugins.WithLimits(plugins.Limits{Timeout: *timeout}))
	d, took, err := host.Call(ctx, wasm, raw, opts...)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(file), err)
	}
	out, _ := json.MarshalIndent(map[string]any{"decision": d, "duration_us": took.Microseconds()}, "", "  ")
	fmt.Fprintln(stdout, string(out))
	return nil
}

func pluginsPush(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	file, rest := splitFile(args)
	fs := flag.NewFlagSet("wb plugins push", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "plugin `name` (default: the file's base name)")
	points := fs.String("points", "admission", "decision `points`, comma-separated: admission, runtime, spend")
	order := fs.Int("order", 0, "place in the project's chain (lower runs first)")
	failOpen := fs.Bool("fail-open", false, "on a plugin failure, allow (with a warning) instead of denying")
	base := fs.String("url", os.Getenv("WB_URL"), "API base `URL` (default $WB_URL)")
	key := fs.String("key", os.Getenv("WB_API_KEY"), "API `key` (default $WB_API_KEY)")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if file == "" || *base == "" || *key == "" {
		fmt.Fprint(stderr, pluginsUsage)
		return errors.New("wb plugins push needs FILE.wasm, and WB_URL and WB_API_KEY (or --url, --key)")
	}
	if *name == "" {
		*name = strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	}
	wasm, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	q := url.Values{"points": {*points}, "order": {fmt.Sprint(*order)}, "fail_open": {fmt.Sprint(*failOpen)}}
	req, err := http.NewRequestWithContext(ctx, "PUT", strings.TrimRight(*base, "/")+"/v1/plugins/"+url.PathEscape(*name)+"?"+q.Encode(), bytes.NewReader(wasm))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+*key)
	req.Header.Set("Content-Type", "application/wasm")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 {
		return fmt.Errorf("push %s: %s: %s", *name, resp.Status, strings.TrimSpace(string(body)))
	}
	fmt.Fprintln(stdout, strings.TrimSpace(string(body)))
	return nil
}
