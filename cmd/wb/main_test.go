//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"wb/internal/wbbin"
)

func TestHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"serve", "node", "agent", "plugins", "sessions", "pty", "desktops", "webhooks", "completion"}},
		{[]string{"serve", "--help"}, []string{"-addr", "-redis", "-runtime", "-data-dir", "-prices", "WB_URL=", "-egress-allow-cidr", "-allow-private-webhooks", "-metrics-token", "-metrics-addr", "-tls-domain", "-tls-on-demand", "-acme-ca", "-acme-ca-root", "-acme-email", "-authz-addr", "-node-token-file", "-desktop-idle", "-snapshot-store", "-node-timeout", "WB_REDIS_URL", "-desktop-pool", "-plugin-timeout", "-webhook-max-backoff", "-fleet-tls-cert", "-fleet-tls-key", "-fleet-tls-ca"}},
		{[]string{"node", "--help"}, []string{"-redis", "-token-file", "WB_NODE_TOKEN", "-advertise", "-runtime", "-egress-allow-cidr", "-backend", "-ch-binary", "-kernel", "-initramfs", "-snapshot-store", "-fleet-tls-cert", "-fleet-tls-key", "-fleet-tls-ca", "-metrics-addr"}},
		{[]string{"fleet", "--help"}, []string{"-runtime", "-nodes", "-gateways", "-dir", "WB_URLS=", "Ctrl-C"}},
		{[]string{"plugins", "--help"}, []string{"wb plugins test", "wb plugins push"}},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), c.args, &out, &errb)
		text := out.String() + errb.String()
		if err != nil && !strings.Contains(err.Error(), "help") {
			t.Errorf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%v: help lacks %q:\n%s", c.args, w, text)
			}
		}
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"frobnicate"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "frobnicate") {
		t.Fatalf("unknown command: %v", err)
	}
	if err := run(context.Background(), []string{"serve", "--addr"}, &out, &errb); err == nil {
		t.Fatal("a flag without its value was accepted")
	}
}

// TestServe: `wb serve` prints exactly the three lines, serves the API with the printed key,
// and stops cleanly when its context ends (as on SIGINT/SIGTERM).
func TestServe(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox-static is needed to assemble the templates")
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--runtime", "none", "--data-dir", t.TempDir(), "--log-level", "error"}, pw, io.Discard)
		pw.Close()
	}()
	lines := make(chan []string, 1)
	go func() {
		b := make([]byte, 4096)
		var got string
		for strings.Count(got, "\n") < 3 {
			n, err := pr.Read(b)
			if err != nil {
				break
			}
			got += string(b[:n])
		}
		lines <- strings.Split(strings.TrimSpace(got), "\n")
		_, _ = io.Copy(io.Discard, pr)
	}()
	var out []string
	select {
	case out = <-lines:
	case <-time.After(60 * time.Second):
		t.Fatal("wb serve printed nothing in 60 s")
	}
	env := map[string]string{}
	for _, l := range out {
		k, v, _ := strings.Cut(l, "=")
		env[k] = v
	}
	if len(out) != 3 || !strings.HasPrefix(env["WB_URL"], "http://127.0.0.1:") || env["WB_API_KEY"] == "" || env["WB_ADMIN_KEY"] == "" {
		t.Fatalf("stdout %q", out)
	}
	req, _ := http.NewRequest("GET", env["WB_URL"]+"/v1/templates", nil)
	req.Header.Set("Authorization", "Bearer "+env["WB_API_KEY"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "tpl_dev_polyglot") {
		t.Fatalf("GET /v1/templates: %d %s", resp.StatusCode, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30 s of its context ending")
	}
}

// TestPluginsTest: `wb plugins test` runs an example plugin, built from source, on a request
// file and prints its decision and timing. The static binary runs it, as a user would: wazero
// compiles the guest several times faster there than inside this race-instrumented test.
func TestPluginsTest(t *testing.T) {
	dir := t.TempDir()
	bin, err := wbbin.Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	wasm := filepath.Join(dir, "tiercap.wasm")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared", "-o", wasm, "../../plugins/examples/tiercap")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	in := filepath.Join(dir, "request.json")
	if err := os.WriteFile(in, []byte(`{"tier":2,"template":"tpl_base","end_user_id":"free_bob"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	test := exec.Command(bin, "plugins", "test", wasm, "--input", in, "--timeout", "1s")
	test.Stdout, test.Stderr = &out, &errb
	if err := test.Run(); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	var got struct {
		Decision struct {
			Allow bool           `json:"allow"`
			Patch map[string]any `json:"patch"`
		} `json:"decision"`
		DurationUs int64 `json:"duration_us"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if !got.Decision.Allow || got.Decision.Patch["tier"] != float64(1) || got.DurationUs <= 0 {
		t.Fatalf("decision %+v", got)
	}
	if err := run(context.Background(), []string{"plugins", "test", wasm}, &out, &errb); err == nil {
		t.Fatal("test without --input accepted")
	}
	if err := run(context.Background(), []string{"plugins", "push", wasm, "--url", "", "--key", ""}, &out, &errb); err == nil {
		t.Fatal("push without a URL accepted")
	}
}
