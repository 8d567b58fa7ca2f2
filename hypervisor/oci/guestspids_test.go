package oci_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/agent"
	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
)

// TestGuestsPidsTotal is the attack of one tenant on the host: guests of two nodes on one
// host, each allowed 128 processes and each running a fork bomb, hold together no more than
// their common cgroup's total (200 here, from a stand-in pid_max of 400: guestsPidsMax), so
// the host's own processes can still fork; afterwards every guest's agent answers again.
// Without the total, 3 guests × 128 is 384: with the host's real pid_max, 32 runc guests
// (or 3 runsc sandboxes) took every process id of the host.
func TestGuestsPidsTotal(t *testing.T) {
	cat := catalog(t)
	dir := t.TempDir()
	pidMax, threadsMax := filepath.Join(dir, "pid_max"), filepath.Join(dir, "threads-max")
	for f, v := range map[string]string{pidMax: "400\n", threadsMax: "1000000\n"} {
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const total = 200
	guests := "/wbpidstest-" + randHex(t, 4)
	var nodes []*oci.Driver
	// Registered before the nodes' own cleanups, so it runs after them: their parents are
	// gone by then, and so the common one can go.
	t.Cleanup(func() {
		if len(nodes) > 0 {
			if err := oci.RemoveCgroup(nodes[0], guests); err != nil {
				t.Errorf("remove %s: %v", guests, err)
			}
		}
	})
	for _, n := range []string{"n1", "n2"} {
		nodes = append(nodes, newDriver(t, oci.RuntimeRunc, func(o *oci.Options) {
			o.CgroupParent, o.GuestsCgroup = guests+"/"+n, guests
			oci.KernelTaskFiles(o, pidMax, threadsMax)
		}))
	}
	d := nodes[0]
	if got := strings.TrimSpace(readFileOr(oci.PidsFile(d, guests, "pids.max"))); got != fmt.Sprint(total) {
		t.Errorf("the guests' common cgroup %s has pids.max %q after both nodes' start, want %d", guests, got, total)
	}

	var clients []*agent.Client
	var cgroups []string
	for _, nd := range []*oci.Driver{nodes[0], nodes[0], nodes[1]} {
		s, c := agentGuest(t, nd, cat[templates.Base], nil)
		if s.Pids <= total/2 {
			t.Fatalf("a guest's own limit %d: the guests must be allowed more than the total together", s.Pids)
		}
		clients = append(clients, c)
		cgroups = append(cgroups, nd.CgroupPath(s.ID))
	}

	// Each bomb ends with its exec's time limit: the agent kills the exec's process group.
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "f(){ f|f& }; f; sleep 60"}, TimeoutS: 10}, nil)
			t.Logf("bomb: exit %d, %v, %d bytes of output", res.ExitCode, err, len(res.Stdout)+len(res.Stderr))
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	most, forkErrs := 0, []string{}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for i, running := 0, true; running; i++ {
		select {
		case <-done:
			running = false
		case <-tick.C:
		}
		sum := 0
		for _, cg := range cgroups {
			sum += max(readInt(t, oci.PidsFile(d, cg, "pids.current")), 0)
		}
		most = max(most, readInt(t, oci.PidsFile(d, guests, "pids.current")), sum)
		if i%10 == 0 {
			if err := exec.Command("true").Run(); err != nil {
				forkErrs = append(forkErrs, err.Error())
			}
		}
	}
	t.Logf("the guests held at most %d processes together (total %d); %s: %s", most, total,
		guests, strings.Join(strings.Fields(readFileOr(oci.PidsFile(d, guests, "pids.events"))), " "))
	if most > total {
		t.Errorf("the guests held %d processes together, above their total of %d: one tenant can take the host's last process ids", most, total)
	}
	if most < total*8/10 {
		t.Errorf("the bombs held at most %d processes together, never near the total of %d: this test proves nothing", most, total)
	}
	if len(forkErrs) > 0 {
		t.Errorf("the host could not fork while the guests' bombs ran: %v", forkErrs)
	}
	for i, c := range clients {
		if rc, out := sh(t, c, "echo alive"); rc != 0 || !strings.Contains(out, "alive") {
			t.Errorf("guest %d after the bombs: exit %d: %s", i, rc, out)
		}
	}
}
