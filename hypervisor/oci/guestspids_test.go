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
// host, each allowed 128 processes, start processes until a fork fails. Together they hold
// no more than their common cgroup's total (200 here, from a stand-in pid_max of 400:
// guestsPidsMax), so the host's own processes can still fork; a guest's start then fails
// saying the guests' total is reached; once their processes end, every guest's agent answers
// again. Without the total, 3 guests × 128 is 384: with the host's real pid_max, 32 runc
// guests at 1024 (or 3 runsc sandboxes) took every process id of the host.
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
	most := 0
	count := func() int {
		sum := 0
		for _, cg := range cgroups {
			sum += max(readInt(t, oci.PidsFile(d, cg, "pids.current")), 0)
		}
		n := readInt(t, oci.PidsFile(d, guests, "pids.current"))
		most = max(most, n, sum)
		return max(n, sum)
	}

	// Each guest starts sleeps until its fork fails (its own limit, or the total), and the
	// sleeps hold their process ids for 15 s.
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, c := range clients {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := c.Exec(ctx, agent.ExecRequest{Argv: []string{"/bin/sh", "-c", "while :; do sleep 15 & done"}, TimeoutS: 30}, nil)
			t.Logf("bomb: exit %d, %v: %.200s", res.ExitCode, err, res.Stdout+res.Stderr)
		})
	}
	for deadline := time.Now().Add(time.Minute); count() < total-5; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the guests' processes never came near their total of %d (at most %d): this test proves nothing", total, most)
		}
	}
	for range 3 {
		if err := exec.Command("true").Run(); err != nil {
			t.Errorf("the host could not fork while the guests held their total: %v", err)
		}
		count()
	}
	s := guestSpec(t, cat[templates.Base], "sleep 100")
	track(t, nodes[1], s)
	err := nodes[1].Create(ctxT(t, time.Minute), s)
	t.Logf("a guest's start at the total: %v", err)
	if err == nil || !strings.Contains(err.Error(), "the host's guests hold") {
		t.Errorf("a guest's start while the guests held their total: %v; want an error that names the guests' total", err)
	}
	count()
	t.Logf("the guests held at most %d processes together (total %d)", most, total)
	if most > total {
		t.Errorf("the guests held %d processes together, above their total of %d: one tenant can take the host's last process ids", most, total)
	}
	for deadline := time.Now().Add(2 * time.Minute); count() > total/2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the guests' sleeps still hold %d processes", count())
		}
	}
	for i, c := range clients {
		if rc, out := sh(t, c, "echo alive"); rc != 0 || !strings.Contains(out, "alive") {
			t.Errorf("guest %d after its processes ended: exit %d: %s", i, rc, out)
		}
	}
}
