package node_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/agent"
)

// dialingDriver reaches its guests' agents itself, as a VM driver does over vsock; here it
// dials the same Unix socket the node would, and counts.
type dialingDriver struct {
	timedDriver
	dataDir string
	dials   *atomic.Int64
}

func (d dialingDriver) DialAgent(ctx context.Context, id string) (net.Conn, error) {
	d.dials.Add(1)
	return agent.DialSocket(ctx, filepath.Join(d.dataDir, "guests", id, "agent", "agent.sock"))
}

// TestAgentDialer: a driver that implements hypervisor.AgentDialer is how the node reaches
// its guests' agents: the health probe dials through it, and exec answers over it.
func TestAgentDialer(t *testing.T) {
	t.Parallel()
	const project = "proj_dialer"
	st, _ := newStore(t)
	d := newDriver(t, "runc", tempDir(t))
	dataDir := tempDir(t)
	cfg := nodeConfig(t, st, d, dataDir, "node_dialer")
	dials := &atomic.Int64{}
	cfg.Driver = dialingDriver{timedDriver: cfg.Driver.(timedDriver), dataDir: dataDir, dials: dials}
	n := startNode(t, cfg)
	s := placed(t, st, project, n.Info.ID, sessionOpts{idleS: 60, lifeS: 120})
	if err := n.Provision(ctxT(t, 2*time.Minute), n.Info, s); err != nil {
		t.Fatal(err)
	}
	before := dials.Load()
	if before == 0 {
		t.Fatal("the guest came up without a single DialAgent: the node dialled the socket itself")
	}
	res, err := execIn(ctxT(t, time.Minute), n.Node, s, "echo through-the-driver")
	if err != nil || !strings.Contains(res.Stdout, "through-the-driver") {
		t.Fatalf("exec = %+v, %v", res, err)
	}
}
