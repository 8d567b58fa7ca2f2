//go:build linux

package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestColdP95Flag(t *testing.T) {
	var f coldP95Flag
	for _, v := range []string{"2=20s", "4=1m"} {
		if err := f.Set(v); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
	}
	ts := f.tiers()
	if ts[1].ColdP95 != 20*time.Second || ts[1].ProvisionDeadline() != time.Minute || ts[3].ColdP95 != time.Minute {
		t.Fatalf("tiers %+v", ts)
	}
	if ts[0].ColdP95 != 2*time.Second {
		t.Fatalf("tier 1 not named keeps the platform's: %v", ts[0].ColdP95)
	}
	if got := f.String(); got != "2=20s,4=1m0s" {
		t.Fatalf("String %q", got)
	}
	for v, want := range map[string]string{"2": "TIER=DURATION", "0=1s": "tier must be 1 to 4", "5=1s": "tier must be 1 to 4",
		"x=1s": "tier", "2=soon": "duration", "2=0s": "duration", "2=-1s": "duration", "2=11m": "at most 10m"} {
		if err := f.Set(v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error saying %q", v, err, want)
		}
	}
}

// TestServeColdP95: the flag reaches the placer: with no node, a tier-2 session fails
// provision_timeout at 3× the given p95, not the default 9 s.
func TestServeColdP95(t *testing.T) {
	env := startServe(t, "--cold-p95", "2=100ms")
	req, _ := http.NewRequest("POST", env["WB_URL"]+"/v1/sessions", strings.NewReader(`{"tier":2}`))
	req.Header.Set("Authorization", "Bearer "+env["WB_API_KEY"])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		ID          string  `json:"id"`
		State       string  `json:"state"`
		StateReason *string `json:"state_reason"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	start := time.Now()
	for s.State != "failed" {
		if time.Since(start) > 6*time.Second { // the default deadline is 9 s
			t.Fatalf("still %s after %v; want failed provision_timeout well before the default 9 s", s.State, time.Since(start))
		}
		time.Sleep(50 * time.Millisecond)
		req, _ := http.NewRequest("GET", env["WB_URL"]+"/v1/sessions/"+s.ID, nil)
		req.Header.Set("Authorization", "Bearer "+env["WB_API_KEY"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&s)
		resp.Body.Close()
	}
	if s.StateReason == nil || *s.StateReason != "provision_timeout" {
		t.Fatalf("failed with %v; want provision_timeout", s.StateReason)
	}
}

// TestNodeTimeoutFlag: --node-timeout is refused below three of the nodes' 2 s heartbeats
// (one late heartbeat would fail a live node's sessions) and above 5 minutes; its default
// keeps the contract's bound on a dead host's sessions (failed within 10 s) with room for a
// loaded placer (conformance/chaos measures it).
func TestNodeTimeoutFlag(t *testing.T) {
	for _, v := range []string{"2s", "6m", "-1s"} {
		err := serve(context.Background(), []string{"--node-timeout", v, "--data-dir", t.TempDir()}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--node-timeout") {
			t.Errorf("--node-timeout %s: %v, want it refused", v, err)
		}
	}
	if defaultNodeTimeout < 3*time.Second || defaultNodeTimeout > 8*time.Second {
		t.Errorf("the default --node-timeout %v: a dead host's sessions must fail within 10 s, with room for the placer", defaultNodeTimeout)
	}
}

// TestPluginTimeoutFlag: --plugin-timeout is refused outside 1ms–10s (the per-project bound),
// by wb serve and wb node alike, naming the flag.
func TestPluginTimeoutFlag(t *testing.T) {
	for _, v := range []string{"0s", "500us", "11s", "-1ms"} {
		err := serve(context.Background(), []string{"--plugin-timeout", v, "--data-dir", t.TempDir()}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--plugin-timeout") || !strings.Contains(err.Error(), "1ms–10s") {
			t.Errorf("wb serve --plugin-timeout %s: %v, want it refused", v, err)
		}
		err = nodeCmd(context.Background(), []string{"--plugin-timeout", v, "--redis", "redis://127.0.0.1:1"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--plugin-timeout") || !strings.Contains(err.Error(), "1ms–10s") {
			t.Errorf("wb node --plugin-timeout %s: %v, want it refused", v, err)
		}
	}
}

// TestWebhookMaxBackoffFlag: --webhook-max-backoff is refused below a second (a dead endpoint
// would be hammered) and above the 24 h retry window (a delivery would get one attempt).
func TestWebhookMaxBackoffFlag(t *testing.T) {
	for _, v := range []string{"500ms", "25h", "0s"} {
		err := serve(context.Background(), []string{"--webhook-max-backoff", v, "--data-dir", t.TempDir()}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--webhook-max-backoff") {
			t.Errorf("--webhook-max-backoff %s: %v, want it refused", v, err)
		}
	}
}
