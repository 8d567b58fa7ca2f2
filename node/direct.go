package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/session"
)

// A runner pool's guests are direct (agent.DirectGuest) where the driver can launch them
// (hypervisor.DirectLauncher: runsc): their init is the runtime's loader (directLoader), with
// no agent, and the node holds their standard streams. Under gVisor the agent's start and
// its part of a run's exec were about a third of a tier-1 run's CPU (BenchmarkRunnerGuestCPU).
// A direct guest takes its session's one exec (a run's code; any other command in a child of
// the loader) and nothing else: a second exec, files, a PTY, a snapshot are refused (409),
// which a tier-1 run's session, made and deleted by its run, never asks for.

// errDirect is the refusal of what a direct guest cannot do.
func errDirect(s *session.Session, what string) error {
	return &StateError{SessionID: s.ID, State: session.Running,
		Detail: fmt.Sprintf("its guest is a tier-1 run's, which takes that run's code and nothing else (%s)", what)}
}

// directLauncher answers the driver as a DirectLauncher, when it can launch direct guests.
func (n *Node) directLauncher() (hypervisor.DirectLauncher, bool) {
	dl, ok := n.Driver.(hypervisor.DirectLauncher)
	return dl, ok && dl.CanLaunchDirect()
}

// directSpec is spec (a guest of tpl's, as n.spec makes it) as a direct guest of runtime
// runner: its init the runtime's argv and directLoader, given the egress relay's guest
// address and the node's egress socket (none where the driver relays the guest's egress
// itself), and no agent.
func directSpec(spec hypervisor.Spec, tpl templates.Template, runner string, drv hypervisor.Driver) (hypervisor.Spec, bool) {
	req, ok := runnerRequest(tpl, runner)
	if !ok || runner != "python3" { // directLoader is python's
		return hypervisor.Spec{}, false
	}
	relay, upstream := GuestProxy, hypervisor.GuestAgentDir+"/"+hypervisor.EgressSocket
	if _, ok := drv.(hypervisor.EgressRelayer); ok {
		relay, upstream = "", ""
	}
	spec.Args = append(slices.Clone(req.Argv), directLoader, relay, upstream)
	spec.AgentBin, spec.AgentSocket = "", ""
	return spec, true
}

// bootDirect launches a direct guest of spec and waits until its loader is ready.
func (p *warmPool) bootDirect(ctx context.Context, dl hypervisor.DirectLauncher, spec hypervisor.Spec) (warmGuest, error) {
	d, err := agent.NewDirectGuest(hypervisor.GuestWorkspace, spec.Env, func() { p.n.stopGuest(spec.ID) })
	if err != nil {
		return warmGuest{}, err
	}
	cleanup := func() {
		d.Close()
		bg := context.WithoutCancel(ctx)
		_ = p.n.Driver.Stop(bg, spec.ID)
		_ = p.n.Driver.Delete(bg, spec.ID)
		_ = removeAll(p.n.guestDir(spec.ID))
	}
	err = dl.LaunchDirect(ctx, spec, d.GuestStdio())
	d.ReleaseGuestStdio()
	if err != nil {
		cleanup()
		return warmGuest{}, fmt.Errorf("launch direct guest: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, directReadyTimeout)
	defer cancel()
	if err := d.WaitReady(rctx); err != nil {
		cleanup()
		return warmGuest{}, err
	}
	return warmGuest{id: spec.ID, direct: d}, nil
}

// directReadyTimeout bounds a direct guest's loader's start (an agent's start and its
// runner's are bounded alike: 30 s each).
const directReadyTimeout = 30 * time.Second

// directAlive reports why a claimed direct guest cannot be used (nil: it can): its loader
// must still wait on its stdin.
func (n *Node) directAlive(id string, d *agent.DirectGuest) error {
	if running, known := n.Driver.KnownRunning(id); known && !running {
		return errors.New("its process is gone")
	}
	if !d.Alive() {
		return errors.New("its loader no longer waits")
	}
	return nil
}

// directFork says whether an exec of argv with env runs in a child of a direct guest's
// loader (fork mode): it is not its runtime's code, or env sets what the interpreter reads as
// it starts.
func directFork(tpl templates.Template, argv []string, env map[string]string) bool {
	return runnerOf(tpl, argv, env) == ""
}

// stopGuest stops guest id, in the background of no caller (a direct guest's exec's kill,
// which must not wait on the runtime's stop under the guest's lock).
func (n *Node) stopGuest(id string) {
	go func() {
		ctx, cancel := context.WithTimeout(n.ctx, time.Minute)
		defer cancel()
		if err := n.Driver.Stop(context.WithoutCancel(ctx), id); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			n.Logger.Warn("node: stop a direct guest", "guest", id, "err", err)
		}
	}()
}

// oomKilled reports whether l's guest's cgroup saw an OOM kill.
func (n *Node) oomKilled(ctx context.Context, l *live) bool {
	s, err := n.stats(ctx, l.g.GuestID)
	return err == nil && s.OOMKills > 0
}

// directProcs lists a direct guest's processes as its runtime sees them
// (hypervisor.ProcessLister), each with its command name for its argv: the guest has no
// agent to read their command lines, so a runtime rule on a process's arguments sees its
// name alone there (a program's name, as the platform's rules match it, is whole).
func (n *Node) directProcs(ctx context.Context, guest string) ([]agent.Proc, error) {
	pl, ok := n.Driver.(hypervisor.ProcessLister)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	ps, err := pl.GuestProcesses(ctx, guest)
	if err != nil {
		return nil, err
	}
	out := make([]agent.Proc, 0, len(ps))
	for _, p := range ps {
		out = append(out, agent.Proc{PID: p.PID, Argv: []string{p.Name}})
	}
	return out, nil
}
