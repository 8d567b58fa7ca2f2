//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"wb/client"
	"wb/internal/cli"
	"wb/internal/loadgen"
	"wb/internal/redistest"
	"wb/internal/servetest"
)

func TestLoadHelpAndFlags(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"load", "--help"}, &out, &errb)
	if err != nil && !strings.Contains(err.Error(), "help") {
		t.Fatal(err)
	}
	for _, w := range []string{"open-loop", "-rate", "-duration", "-url", "-key", "-mix", "-tier", "-concurrency", "-redis", "-fleet", "-baseline", "-search-p99", "-search-max", "coordinated omission", "Exit code"} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("wb load --help lacks %q:\n%s", w, errb.String())
		}
	}
	for _, bad := range [][]string{
		{"--mix", "create-exec-delete=1,bogus=2"},
		{"--rate", "0"},
		{"--tier", "7"},
		{"-o", "yaml"},
		{"--concurrency", "0"},
		{"--search-p99", "-1s"},
		{"--search-p99", "10ms", "--search-max", "0.5"},
		{"extra"},
	} {
		args := append([]string{"load", "--url", "http://127.0.0.1:1", "--key", "k"}, bad...)
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("wb load %v accepted", bad)
		}
	}
	t.Setenv("WB_URL", "")
	t.Setenv("WB_URLS", "")
	if err := run(context.Background(), []string{"load", "--key", "k"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "--url") {
		t.Errorf("no gateway: %v", err)
	}
}

// TestLoadOutcome: a leak (or a check that could not be made) ends wb load with exit code 3;
// a clean run with 0.
func TestLoadOutcome(t *testing.T) {
	one := int64(1)
	for _, c := range []struct {
		leaks loadgen.Leaks
		code  int
	}{
		{loadgen.Leaks{}, 0},
		{loadgen.Leaks{ActiveSessions: []string{"sess_x"}}, exitLeaked},
		{loadgen.Leaks{RedisSlots: &one}, exitLeaked},
		{loadgen.Leaks{Guests: map[string][]string{"node_1": {"g"}}}, exitLeaked},
		{loadgen.Leaks{CheckErrors: []string{"redis: refused"}}, exitLeaked},
	} {
		err := loadOutcome(&loadgen.Report{Leaks: c.leaks})
		var exit *cli.ExitError
		switch {
		case c.code == 0 && err != nil:
			t.Errorf("%+v: %v", c.leaks, err)
		case c.code != 0 && (!errors.As(err, &exit) || exit.Code != c.code || !strings.Contains(err.Error(), "LEAKED")):
			t.Errorf("%+v: %v, want exit code %d", c.leaks, err, c.code)
		}
	}
}

// TestLoadAgainstServe: wb load against a wb serve with runc guests, for a few seconds at a
// low rate: the table's counts match the schedule and the mix, nothing fails, and nothing
// leaks (the API's list and the project's slots in Redis). Then a session left running on
// purpose is reported as leaked, with exit code 3.
func TestLoadAgainstServe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts wb serve with real guests")
	}
	redisURL := "redis://" + redistest.ServerAddr(t) + "/0"
	// servetest's provisioning deadlines are a loaded machine's (a minute): this test counts
	// flows and leaks, and at the default 6 s a cold make test's busiest minute failed four
	// sessions whose runc create and start took longer.
	srv := servetest.Start(t, "--redis", redisURL)
	defer func() {
		if t.Failed() {
			t.Logf("wb serve's log:\n%s", srv.Log())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := []string{"load", "--url", srv.URL, "--key", srv.APIKey, "--redis", redisURL, "-o", "json"}
	var out, errb bytes.Buffer
	// 2 flows/s for 4 s: 8 flows, dealt 4 create-exec-delete, 2 run, 2 pause-resume.
	err := run(ctx, append(base, "--rate", "2", "--duration", "4s", "--baseline", "1s", "--settle", "30s",
		"--mix", "create-exec-delete=2,run=1,pause-resume=1"), &out, &errb)
	if err != nil {
		t.Fatalf("wb load: %v\n%s\n%s", err, out.String(), errb.String())
	}
	var rep loadgen.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out.String())
	}
	if f := rep.Flows; f.Scheduled != 8 || f.Completed != 8 || f.Failed != 0 || f.ByFlow["create-exec-delete"].Runs != 4 ||
		f.ByFlow["run"].Runs != 2 || f.ByFlow["pause-resume"].Runs != 2 {
		t.Errorf("flows %+v", f)
	}
	for op, n := range map[string]int{"create": 6, "ready": 6, "exec": 4, "run": 2, "pause": 2, "resume": 2, "delete": 6} {
		o := rep.Op(op)
		if o.Count != n || o.Errors != 0 || o.P50Ms <= 0 || o.P99Ms < o.P50Ms || o.MaxMs < o.P99Ms {
			t.Errorf("%s: %+v, want %d calls, no error", op, o, n)
		}
	}
	if len(rep.Errors) != 0 {
		t.Errorf("errors %+v", rep.Errors)
	}
	if rep.Leaks.Any() || rep.Leaks.RedisSlots == nil || *rep.Leaks.RedisSlots != 0 {
		t.Errorf("leaks %+v", rep.Leaks)
	}
	if len(rep.Baseline) != 2 || rep.Baseline[0].Count != 2 || rep.Baseline[0].Errors != 0 {
		t.Errorf("baseline %+v", rep.Baseline)
	}

	// A session nobody deletes: the next run's check finds it, in the list and in Redis.
	c, err := client.New(srv.URL, srv.APIKey)
	if err != nil {
		t.Fatal(err)
	}
	stray, err := c.CreateSession(ctx, client.CreateSessionRequest{Tier: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.DeleteSession(context.WithoutCancel(ctx), stray.ID)
	out.Reset()
	// The stray never goes, so this run waits out its whole settle. 5 s is for the run flow's
	// own session to stop: a whole clean run of this size (flow, delete and settle) took
	// 0.6-0.7 s here with the load average at 15-40 on 2 cores.
	err = run(ctx, append(base, "--rate", "1", "--duration", "1s", "--baseline", "0", "--settle", "5s", "--mix", "run=1"), &out, &errb)
	var exit *cli.ExitError
	if !errors.As(err, &exit) || exit.Code != exitLeaked {
		t.Fatalf("a leaked session: %v, want exit code %d\n%s", err, exitLeaked, out.String())
	}
	rep = loadgen.Report{}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Leaks.ActiveSessions, []string{stray.ID}) || rep.Leaks.RedisSlots == nil || *rep.Leaks.RedisSlots != 1 {
		t.Errorf("leaks %+v, want %s and 1 slot", rep.Leaks, stray.ID)
	}
}
