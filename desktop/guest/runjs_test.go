package guest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// argvExecer records the argv of the one exec it answers (an eval's JSON value, 1).
type argvExecer struct{ argv []string }

func (e *argvExecer) Exec(_ context.Context, argv []string, _ []byte) ([]byte, []byte, int, error) {
	e.argv = argv
	return []byte(`{"value":1}`), nil, 0, nil
}

// TestRunJSLimit: the script's time limit is the caller's (0: RunJSTimeout), within 1 ms to
// RunJSTimeout, and never past the call's deadline less 5 s; out of range, nothing runs.
func TestRunJSLimit(t *testing.T) {
	t.Parallel()
	long, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	short, cancel2 := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel2()
	near, cancel3 := context.WithTimeout(context.Background(), 5500*time.Millisecond)
	defer cancel3()
	for _, c := range []struct {
		name      string
		ctx       context.Context
		limit     time.Duration
		wantMs    string // the --timeout-ms passed, "" when RunJS refuses
		wantError string
	}{
		{"default", long, 0, "30000", ""},
		{"the caller's", long, 1500 * time.Millisecond, "1500", ""},
		{"one millisecond", long, time.Millisecond, "1", ""},
		{"cut to the deadline", short, 0, "~3000", ""},
		{"beyond the most", long, RunJSTimeout + time.Millisecond, "", "must be 1 ms to 30s"},
		{"below a millisecond", long, time.Microsecond, "", "must be 1 ms to 30s"},
		{"negative", long, -time.Second, "", "must be 1 ms to 30s"},
		{"too near the deadline", near, 0, "", "less than 6 s left"},
	} {
		ex := &argvExecer{}
		_, err := RunJS(c.ctx, ex, "1", c.limit)
		if c.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantError) || ex.argv != nil {
				t.Errorf("%s: err %v, ran %v; want %q and nothing run", c.name, err, ex.argv, c.wantError)
			}
			continue
		}
		if err != nil || len(ex.argv) < 2 {
			t.Fatalf("%s: %v, argv %v", c.name, err, ex.argv)
		}
		got := ex.argv[len(ex.argv)-1]
		if c.wantMs == "~3000" { // the deadline's 3 s, less what passed since
			if ms, err := strconv.Atoi(got); err != nil || ms > 3000 || ms < 2000 {
				t.Errorf("%s: --timeout-ms %s, want about 3000", c.name, got)
			}
		} else if got != c.wantMs {
			t.Errorf("%s: --timeout-ms %s, want %s", c.name, got, c.wantMs)
		}
	}
}

// stalledExecer answers an exec as one that ran past its timeout, with what it printed so far.
type stalledExecer struct{ stdout string }

func (e stalledExecer) Exec(context.Context, []string, []byte) ([]byte, []byte, int, error) {
	return []byte(e.stdout), nil, -1, errors.New("/bin/sh did not finish within 119s")
}

// TestStartSaysHowFarItGot: a start whose exec times out says what the script printed before
// (a stage it passed), not only that it timed out: a rare hang of the setup under load said
// only "/bin/sh did not finish within 119s", and where it waited took a live investigation.
func TestStartSaysHowFarItGot(t *testing.T) {
	t.Parallel()
	err := Start(context.Background(), stalledExecer{stdout: "the display answers\n"})
	if err == nil || !strings.Contains(err.Error(), "did not finish within 119s") || !strings.Contains(err.Error(), "the display answers") {
		t.Errorf("a start that timed out after the display answered: %v; want the timeout and what the script said", err)
	}
	if !strings.Contains(startScript(90), `echo "the display answers"`) {
		t.Error("the start script does not say when the display answers")
	}
}
