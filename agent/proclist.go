package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
)

// Proc is one process of the guest, as GET /v1/procs lists it.
type Proc struct {
	PID  int      `json:"pid"`
	Argv []string `json:"argv"`
}

// listProcs reads the guest's /proc: every process with a command line (kernel threads and
// zombies have none).
func listProcs() []Proc {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	out := make([]Proc, 0, len(dirs))
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		var argv []string
		for _, a := range bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0}) {
			argv = append(argv, string(a))
		}
		out = append(out, Proc{PID: pid, Argv: argv})
	}
	return out
}

func (s *server) handleProcs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, listProcs())
}

// Procs lists the guest's processes.
func (c *Client) Procs(ctx context.Context) ([]Proc, error) {
	var out []Proc
	err := c.getJSON(ctx, "/v1/procs", nil, &out)
	return out, err
}

// handleEndProcs ends every process of the guest but the agent (POST /v1/procs/end), as the
// fork-bomb guard does: the node asks when the guest's sandbox nears its host process limit
// (under gVisor's ptrace platform the sandbox's host tasks grow with its processes' churn,
// and a bomb that hovers below the guest's own limit never wakes the guard), and would
// otherwise see the sandbox die at that limit; and when the host's guests near their process
// total and this guest holds the most. Where the agent keeps no pids cgroup it ends them as
// the guest's init (endAllAsInit: a runc guest); where it is not the init either, it cannot
// find every process, and says so.
func (s *server) handleEndProcs(w http.ResponseWriter, _ *http.Request) {
	if s.procs.cg == nil {
		if n, ok := endAllAsInit(); ok {
			s.log.Warn("agent: ended every process of the guest at the node's request (the guest's init, without a pids cgroup of its own)", "killed", n)
			writeJSON(w, http.StatusOK, endProcsAnswer{Ended: n})
			return
		}
		writeError(w, http.StatusNotImplemented, "unsupported", "the agent keeps no process limit of its own in this guest (it is not the guest's init, or could not set one up), so it cannot end every process", "")
		return
	}
	n := s.procs.cg.endAll()
	s.log.Warn("agent: ended every process of the guest at the node's request (its sandbox neared its host process limit)", "killed", n)
	writeJSON(w, http.StatusOK, endProcsAnswer{Ended: n})
}

// endProcsAnswer is the answer to POST /v1/procs/end: how many processes the agent found to
// end, at most.
type endProcsAnswer struct {
	Ended int `json:"ended"`
}

// EndProcs asks the agent to end every process of the guest but itself, and answers how many
// it found to end. See EndUnsupported for an agent that cannot.
func (c *Client) EndProcs(ctx context.Context) (int, error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/procs/end", nil, nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out endProcsAnswer
	if err := json.NewDecoder(boundAnswer(resp.Body)).Decode(&out); err != nil {
		return 0, fmt.Errorf("agent: POST /v1/procs/end: decode answer: %w", err)
	}
	return out.Ended, nil
}

// EndUnsupported reports whether err, from EndProcs, says the agent cannot end the guest's
// processes: an agent from before POST /v1/procs/end (404, no such route), or one that keeps
// no process limit of its own (501). Asking it again does not help.
func EndUnsupported(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Status == http.StatusNotFound || e.Status == http.StatusNotImplemented)
}
