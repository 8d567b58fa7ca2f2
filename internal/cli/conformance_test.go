package cli

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"wb/conformance/suite"
)

// runConformance runs `wb conformance args…` with rows in place of the suite's (they make
// no call: the URL is never dialled).
func runConformance(t *testing.T, rows []suite.Row, args ...string) (string, error) {
	t.Helper()
	a, out, _ := newTestApp(env{"WB_URL": "http://127.0.0.1:1", "WB_API_KEY": "wb_test"}, "")
	root := a.newRoot()
	for _, c := range root.Commands() {
		if c.Name() == "conformance" {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(a.conformanceCmdOf(rows))
	root.SetArgs(append([]string{"conformance"}, args...))
	root.SetOut(out)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestConformanceCommand(t *testing.T) {
	pass := suite.Row{Seed: "000", Table: "States", Row: "running", Check: func(context.Context, *suite.Env) (string, error) {
		return "session_s 0 → 3", nil
	}}
	fail := suite.Row{Seed: "000", Table: "Pause limits", Row: "tier 1", Check: func(context.Context, *suite.Env) (string, error) {
		return "pause answered 200", errors.New("want 409")
	}}

	out, err := runConformance(t, []suite.Row{pass})
	if err != nil {
		t.Fatalf("all rows pass: %v", err)
	}
	for _, w := range []string{"SEED", "TABLE", "ROW", "RESULT", "SAW", "000", "States", "running", "PASS", "session_s 0 → 3", "PASS: 1 passed, 0 failed, 0 skipped of 1 rows"} {
		if !strings.Contains(out, w) {
			t.Errorf("the table lacks %q:\n%s", w, out)
		}
	}

	out, err = runConformance(t, []suite.Row{pass, fail})
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 1 {
		t.Fatalf("a failed row: want exit code 1, got %v", err)
	}
	if !strings.Contains(out, "FAIL    pause answered 200; want 409") || !strings.Contains(out, "FAIL: 1 passed, 1 failed") {
		t.Errorf("the failed row's line or the summary:\n%s", out)
	}

	// --run leaves the failing row out; -o json prints the report.
	out, err = runConformance(t, []suite.Row{pass, fail}, "--run", "States", "-o", "json")
	if err != nil {
		t.Fatalf("--run States: %v", err)
	}
	var rep suite.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Results) != 1 || rep.Results[0].Status != suite.Pass {
		t.Errorf("-o json: %v %s", err, out)
	}

	if _, err := runConformance(t, nil, "--run", "("); err == nil || !strings.Contains(err.Error(), "--run") {
		t.Errorf("a bad --run: %v", err)
	}
}
