package agent

import (
	"bytes"
	"context"
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
