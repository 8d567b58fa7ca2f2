package oci

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"

	"wb/hypervisor"
)

// GuestProcesses lists a guest's processes as its runtime sees them (hypervisor.ProcessLister),
// for a guest with no agent to list them (a direct guest): `ps --format table`, each
// process's pid and command name. The names are the guest's to choose (a process may name
// itself anything, newlines included): a line that does not parse is skipped, and the
// runtime's output is read up to guestProcsMax bytes.
func (d *Driver) GuestProcesses(ctx context.Context, id string) ([]hypervisor.GuestProcess, error) {
	cmd := exec.CommandContext(ctx, d.rt.Command, append(d.globalArgs(), "ps", "--format", "table", id)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("oci: %s ps %s: %w", d.name, id, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("oci: %s ps %s: %w", d.name, id, err)
	}
	b, rerr := io.ReadAll(io.LimitReader(out, guestProcsMax))
	_, _ = io.Copy(io.Discard, out) // the rest, so that the runtime ends
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("oci: %s ps %s: %w", d.name, id, err)
	}
	if rerr != nil {
		return nil, fmt.Errorf("oci: %s ps %s: %w", d.name, id, rerr)
	}
	return parseProcessTable(string(b)), nil
}

// guestProcsMax bounds what GuestProcesses reads of the runtime's table: a guest's process
// count is bounded by its limit, each line by its name's 16 bytes (comm).
const guestProcsMax = 1 << 20

// parseProcessTable reads `runsc ps --format table`: a header (UID PID PPID C TTY STIME TIME
// CMD), then a process a line, its name the rest of the line after the seventh field.
func parseProcessTable(table string) []hypervisor.GuestProcess {
	lines := strings.Split(table, "\n")
	if len(lines) == 0 {
		return nil
	}
	head := strings.Fields(lines[0])
	if len(head) < 8 || head[1] != "PID" || head[7] != "CMD" {
		return nil
	}
	var out []hypervisor.GuestProcess
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			continue
		}
		out = append(out, hypervisor.GuestProcess{PID: pid, Name: strings.Join(f[7:], " ")})
	}
	return out
}
