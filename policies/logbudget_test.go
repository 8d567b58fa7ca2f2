package policies

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"wb/internal/logbudget"
	"wb/internal/syncbuf"
)

// TestFailedEvaluationLogIsRateLimited: the engine's line for each failed evaluation of a
// project's policy keeps to the project's budget (logbudget), and a line says how many were
// dropped. Before, a runtime policy that failed at every event (here a function's conflicting
// outputs) wrote a line of about a kilobyte for each: some 3 MB a second from one loop of a
// guest's egress attempts.
func TestFailedEvaluationLogIsRateLimited(t *testing.T) {
	var buf syncbuf.Buffer
	e := newEngine(t, nil, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	ctx := context.Background()
	const p = "proj_failflood"
	src := "package wb.runtime\n\nf(x) := 1 if x\nf(x) := 2 if x\n\nallow_egress := f(true) == 1\n"
	rt, err := e.Put(ctx, p, "fails", src, ModeEnforce)
	if err != nil {
		t.Fatal(err)
	}
	event := map[string]any{"type": "egress", "host": "example.com", "port": 443, "session": map[string]any{"id": "sess_1", "tier": 2}}
	// Until the calls are 64 past the budget (its burst, and its rate over their time), not
	// for a fixed time: plugins' like test made only 270 calls in 1.5 s on a loaded machine,
	// all within the budget.
	start := time.Now()
	calls := 0
	for ; calls < logbudget.Burst+int(time.Since(start).Seconds()*logbudget.Rate)+64; calls++ {
		if time.Since(start) > time.Minute {
			t.Fatalf("%d evaluations in a minute, too slow to pass the log's budget of %s", calls, logbudget.Limits())
		}
		d, err := e.Runtime(ctx, p, rt.ID, event)
		if err != nil || !d.Deny || !strings.Contains(d.DenyReason, "evaluation failed") {
			t.Fatalf("a failing enforced policy: %+v, %v; want the event refused, the failure named", d, err)
		}
	}
	took := time.Since(start)
	out := buf.String()
	kept := strings.Count(out, `msg="policies: policy evaluation failed" project=`+p)
	most := logbudget.Burst + int(2*took.Seconds()*logbudget.Rate) + 1
	if kept > most {
		t.Errorf("%d failed evaluations in %s logged %d lines, want at most %d (%s)", calls, took.Round(time.Millisecond), kept, most, logbudget.Limits())
	}
	if kept == 0 || !strings.Contains(out, "were dropped") {
		t.Errorf("%d lines of failed evaluations, and no line says that some were dropped", kept)
	}
}
