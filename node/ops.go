package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/templates"
	"wb/session"
	"wb/store"
)

// quiesceMost bounds how long the agent stays off its socket for a memory snapshot should
// the node never create its resume file (the node died mid-snapshot). A fixed window in its
// place once lost the race with a slow checkpoint on a loaded host, which stopped the guest.
const quiesceMost = 60 * time.Second

// quiesceAnswer bounds the wait for the agent's answer to a quiesce, which it gives once it
// has closed its sockets: at once, but for a loaded host. A cold make test saw one never
// come, and the snapshot, which holds the guest's lock, held it for good.
const quiesceAnswer = 30 * time.Second

// resumeFile names the file that ends the quiesce of a memory snapshot's agent. It derives from
// the snapshot's id, so that whichever node restores the snapshot, into whichever guest, knows
// it: the restored agent is still waiting for it (for at most quiesceMost, which a restore
// into a new session once waited out in full).
func resumeFile(snapshotID string) string { return "resume-" + snapshotID }

// resumeAgent creates the resume file that ends a quiesce of guest id's agent.
func (n *Node) resumeAgent(id, name string) error {
	if err := createInGuestDir(filepath.Join(n.guestDir(id), "agent"), name); err != nil {
		return fmt.Errorf("resume the agent: %w", err)
	}
	return nil
}

// createInGuestDir creates the empty regular file name in dir, a directory the guest can
// write (its agent dir, under gVisor), or takes the regular file already there. It follows
// no symlink the guest planted there, which would have the node create or truncate any host
// file as root: name is opened O_NOFOLLOW relative to dir's own descriptor, never for
// writing (the file's being there is all it says), and O_NONBLOCK, so that a fifo there
// cannot hold the node; anything but a regular file is refused.
func createInGuestDir(dir, name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("%q is not a plain file name", name)
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("create %s in %s (a symlink there is refused): %w", name, dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s in %s: %w", name, dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s in %s is not a regular file (mode %#o); refusing it", name, dir, st.Mode)
	}
	return nil
}

// activitySaved is how often, at most, activity alone writes a guest's journal.
const activitySaved = time.Second

// touch records activity: it resets the idle timer and re-arms the idle warning. The
// journal learns of it at most once per activitySaved: a journal write (a file replaced by
// rename, which ext4 flushes) took about 0.6 ms here, and every exec touched twice. A write
// for activity counts the next activitySaved as active too (ActivityUntil), so a restart
// finds the last activity late by at most that much, never early: the idle timer may fire
// that much late after a restart, never before its time. The caller holds l.mu, and makes
// the write touch answers once it has let go of it, before it goes on.
func (n *Node) touch(l *live) (land func()) {
	now := n.Now()
	l.g.LastActivity = now
	if l.g.IdleWarned {
		// The re-arm joins the pending changes, behind the warning's own write: written
		// straight to Redis, it could land before a warning still queued (a loaded node, or
		// Redis away), and the session kept idle_warning_at after its activity.
		l.g.IdleWarned = false
		l.g.Pending = append(l.g.Pending, pending{Kind: "rearm", Event: session.EventIdleWarning, At: now})
		defer n.flushAsync(l)
	} else if now.Before(l.g.ActivityUntil) {
		return func() {}
	}
	l.g.ActivityUntil = now.Add(activitySaved)
	return n.saveLater(l)
}

// Touch records activity on a session (a PTY frame, a file call).
func (n *Node) Touch(s *session.Session) {
	l, err := n.lookup(s.ID)
	if err != nil {
		return
	}
	l.mu.Lock()
	land := n.touch(l)
	l.mu.Unlock()
	land()
}

// running answers the session's guest if it is running here, and its agent's client, read
// under the guest's lock: a memory snapshot replaces the client as it restores the guest. A
// direct guest, which has no agent, is refused (errDirect): what asks for its agent is not
// its one exec.
func (n *Node) running(s *session.Session) (*live, *agent.Client, error) {
	l, ag, direct, err := n.runningGuest(s)
	if err == nil && direct {
		return nil, nil, errDirect(s, "files, PTYs and agent calls")
	}
	return l, ag, err
}

// runningGuest is running that answers a direct guest too (direct: ag is nil).
func (n *Node) runningGuest(s *session.Session) (l *live, ag *agent.Client, direct bool, err error) {
	l, err = n.lookup(s.ID)
	if err != nil {
		return nil, nil, false, err
	}
	l.mu.Lock()
	if st := l.g.State; st != session.Running {
		l.mu.Unlock()
		return nil, nil, false, &StateError{SessionID: s.ID, State: st}
	}
	land := n.touch(l)
	ag, direct = l.agent, l.direct != nil
	l.mu.Unlock()
	land()
	return l, ag, direct, nil
}

// Exec runs a command in the session's guest through its agent.
func (n *Node) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, _ []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	l, ag, direct, err := n.runningGuest(s)
	if err != nil {
		return session.ExecResult{}, err
	}
	areq, err := agent.ExecRequestFrom(&req)
	if err != nil {
		return session.ExecResult{}, err
	}
	op := lockFor(l, "exec policy check")
	err = n.checkExec(ctx, l, areq.Argv)
	ref, guest := l.g.Template, l.g.GuestID
	op.unlock()
	if err != nil {
		return session.ExecResult{}, err
	}
	defer n.Metrics.execStarted()() // as the node's API counts its execs, after the check
	areq.Runner = n.runnerFor(ref, areq.Argv, areq.Env)
	ooms, counted := n.oomsBefore(ctx, l, guest)
	ectx, clock, cancel := n.execBackstop(ctx, areq.TimeoutS)
	defer cancel()
	if out != nil {
		// The time out takes is the caller's, not the agent's (execClock).
		callerOut := out
		out = func(ch session.ExecChunk) error {
			clock.toCaller()
			defer clock.toAgent()
			return callerOut(ch)
		}
	}
	var res session.ExecResult
	if direct {
		var tpl templates.Template
		if tpl, err = n.template(ref); err == nil {
			res, err = l.direct.Exec(ectx, areq, directFork(tpl, areq.Argv, areq.Env), 0, out)
		}
		if errors.Is(err, agent.ErrDirectUsed) {
			err = errDirect(s, "its run's exec ran already")
		}
	} else {
		res, err = ag.Exec(ectx, areq, out)
	}
	if ae := (*agent.Error)(nil); errors.As(err, &ae) {
		// The agent's answer, which must not pass for the node's refusal (fromGuest).
		if g := fromGuestAgent(ae); g != ae {
			err = g
		}
	}
	n.Touch(s) // a long exec counts as activity until it ends
	if counted {
		n.endIfOOM(ctx, l, guest, ooms)
	}
	switch {
	case err != nil && errors.Is(context.Cause(ectx), errExecUnanswered):
		err = context.Cause(ectx)
	case err != nil && ctx.Err() == nil:
		err = n.whyExecBroke(ctx, l, err)
	}
	return res, err
}

// execBackstop bounds an exec of timeoutS seconds (0: the default) at its timeout and
// execGrace of the agent's time: an agent that never answers it, or never finishes its
// answer (hung, or its answer lost), would hold the request, and its caller, for ever. The
// request ends then, with a cause that wraps errExecUnanswered and says so, and with its
// connection the agent kills the command's processes, as its own timeout does (agent: a
// client gone). The time the exec waits for its caller to take its output is not the
// agent's, and does not count (execClock): a caller that reads slowly, or stops for a while,
// gets the whole answer, as from the agent directly; one that never reads again holds its
// own request, which its context ends. The exec's code tells the clock whom it waits on.
func (n *Node) execBackstop(ctx context.Context, timeoutS int) (context.Context, *execClock, context.CancelFunc) {
	if timeoutS <= 0 {
		timeoutS = session.ExecTimeoutDefaultS
	}
	ctx, cancel := context.WithCancelCause(ctx)
	c := &execClock{start: time.Now(), budget: time.Duration(timeoutS)*time.Second + n.execGrace, cancel: cancel,
		cause: fmt.Errorf("node: %w within its timeout of %d s and a grace of %s (the time its caller took to read the output not counted); the exec was ended, which kills its processes as its timeout does",
			errExecUnanswered, timeoutS, n.execGrace)}
	c.mu.Lock()
	c.timer = time.AfterFunc(c.budget, c.check)
	c.mu.Unlock()
	// The agent's clock spares a caller slow to read; the wall's bounds the whole exec, which
	// an answer without end, read as slowly as it comes, would otherwise never reach.
	drained := fmt.Errorf("node: %w to its end within its timeout of %d s, a grace of %s and %s for its caller to read it; the exec was ended, which kills its processes as its timeout does",
		errExecUnanswered, timeoutS, n.execGrace, n.ExecDrain)
	wall := time.AfterFunc(c.budget+n.ExecDrain, func() { cancel(drained) })
	return context.WithValue(ctx, execClockKey{}, c), c, func() {
		c.timer.Stop()
		wall.Stop()
		cancel(context.Canceled)
	}
}

// execClock is an exec's backstop (execBackstop): it counts the time the exec waits on its
// agent, and ends the exec once that passes its budget.
type execClock struct {
	start  time.Time
	budget time.Duration // the exec's timeout and the grace
	cancel context.CancelCauseFunc
	cause  error

	mu       sync.Mutex
	timer    *time.Timer
	onCaller time.Time     // since when the exec waits on its caller; zero: on its agent
	caller   time.Duration // how long it waited on its caller before
	parked   bool          // the timer went off while it waited on its caller
}

// execClockKey is the context key of an exec's clock through the node's proxy (apiAgent).
type execClockKey struct{}

// toCaller says the exec waits on its caller (to take its output) from now. A nil clock
// (an answer with no backstop) ignores it.
func (c *execClock) toCaller() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.onCaller.IsZero() {
		c.onCaller = time.Now()
	}
}

// toAgent says the exec waits on its agent from now.
func (c *execClock) toAgent() {
	if c == nil {
		return
	}
	c.mu.Lock()
	if !c.onCaller.IsZero() {
		c.caller += time.Since(c.onCaller)
		c.onCaller = time.Time{}
	}
	parked := c.parked
	c.parked = false
	c.mu.Unlock()
	if parked {
		c.check()
	}
}

// check ends the exec if its agent's time passed the budget, and else looks again when it
// may have; while the exec waits on its caller, toAgent looks again.
func (c *execClock) check() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.onCaller.IsZero() {
		c.parked = true
		return
	}
	if left := c.budget + c.caller - time.Since(c.start); left > 0 {
		c.timer.Reset(left)
		return
	}
	c.cancel(c.cause)
}

// errExecUnanswered ends an exec whose agent took longer than its timeout and grace
// (execBackstop).
var errExecUnanswered = errors.New("the guest's agent did not answer the exec")

// execGrace is how long past an exec's timeout the node waits for its agent's answer: the
// agent's own timeout kills the command's processes and answers within moments, even on a
// loaded host.
const execGrace = 30 * time.Second

// DefaultWriteStall is Config.WriteStall's default.
const DefaultWriteStall = time.Minute

// DefaultExecDrain is Config.ExecDrain's default: an exec's answer lasts at most its
// timeout, the grace and this, however slowly its caller reads.
const DefaultExecDrain = 10 * time.Minute

// oomKills answers guest's count of OOM kills, where the driver reads it
// (hypervisor.OOMCounter).
func (n *Node) oomKills(ctx context.Context, guest string) (int64, bool) {
	c, ok := n.Driver.(hypervisor.OOMCounter)
	if !ok {
		return 0, false
	}
	k, err := c.OOMKills(ctx, guest)
	return k, err == nil
}

// oomsBefore answers guest's count of OOM kills as an exec starts: the count the node last
// read for it, at an exec's end, else read now. Any kill the count gains fails the session
// (Events reports each), so one the exec's end finds that came before the exec fails it as
// Events' poll would, only sooner; and an exec reads the count once, not twice.
func (n *Node) oomsBefore(ctx context.Context, l *live, guest string) (int64, bool) {
	l.mu.Lock()
	if l.oomGuest == guest {
		k := l.ooms
		l.mu.Unlock()
		return k, true
	}
	l.mu.Unlock()
	k, ok := n.oomKills(ctx, guest)
	if ok {
		l.mu.Lock()
		l.keepOOMs(guest, k)
		l.mu.Unlock()
	}
	return k, ok
}

// keepOOMs keeps k as guest's count of OOM kills unless a higher one of it is kept (two
// execs' ends may read in one order and keep in the other). The caller holds l.mu.
func (l *live) keepOOMs(guest string, k int64) {
	if l.oomGuest != guest || k > l.ooms {
		l.ooms, l.oomGuest = k, guest
	}
}

// endIfOOM fails the session with oom when its guest counts more OOM kills than before (an
// exec's start, see oomsBefore): the exec that the kill ended then answers after the session
// failed, as the contract's "failed, up to the kill" wants, and the caller's next call finds
// it so, where Events' poll could report it only after that call (runc: the OOM killer takes
// the process, and the guest lives on to answer it).
func (n *Node) endIfOOM(ctx context.Context, l *live, guest string, before int64) {
	after, ok := n.oomKills(ctx, guest)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keepOOMs(guest, after)
	if after <= before {
		return
	}
	if l.g.State == session.Running && l.g.GuestID == guest {
		n.Logger.Warn("guest OOM, seen at an exec's end", "session", l.g.SessionID)
		n.end(n.ctx, l, session.Node, session.OOM, "")
	}
}

// whyExecBroke explains an exec whose answer broke off because its guest died under it (a
// memory hog the OOM killer took, a guest that crashed): it waits for the watcher to end the
// session, and names state and reason. It stops waiting as soon as the guest's agent answers
// (the guest lives: the answer broke for another reason), and after brokenExecWait at most:
// a loaded host may take seconds to report a guest's death, and a fixed short wait answered
// such an exec without its reason.
func (n *Node) whyExecBroke(ctx context.Context, l *live, err error) error {
	ctx, cancel := context.WithTimeout(ctx, brokenExecWait)
	defer cancel()
	for {
		l.mu.Lock()
		st, reason, ag, id := l.g.State, l.g.Reason, l.agent, l.g.SessionID
		l.mu.Unlock()
		if st != session.Running && reason != "" {
			// A refusal of the guest's state, as the exec's caller would have had a moment
			// later: the gateway answers 409 naming it, without waiting for Redis to say so.
			return &StateError{SessionID: id, State: st,
				Detail: fmt.Sprintf("its guest ended during the exec (reason %s): %v", reason, err)}
		}
		if st != session.Running || ag == nil {
			return err
		}
		hctx, hcancel := context.WithTimeout(ctx, time.Second)
		alive := ag.Health(hctx) == nil
		hcancel()
		if alive {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// brokenExecWait bounds whyExecBroke's wait for the watcher's verdict.
const brokenExecWait = 30 * time.Second

// Agent answers the agent of the session's running guest, for files and PTY.
func (n *Node) Agent(_ context.Context, s *session.Session) (*agent.Client, error) {
	_, ag, err := n.running(s)
	if err != nil {
		return nil, err
	}
	return ag, nil
}

// Pause freezes the guest.
func (n *Node) Pause(ctx context.Context, s *session.Session) error {
	l, err := n.lookup(s.ID)
	if err != nil {
		return err
	}
	op := lockFor(l, "pause")
	defer op.unlock()
	if l.g.State != session.Running {
		return &StateError{SessionID: s.ID, State: l.g.State}
	}
	if err := n.Driver.Pause(ctx, l.g.GuestID); err != nil {
		return err
	}
	// Frozen, its agent answers nothing: a request that it end the guest's processes is
	// given up now, not after endProcsTimeout, and one begun until the resume at once.
	l.ending.pause()
	// Billed as running until the guest is frozen (a loaded host's freeze took seconds), and
	// as paused from then: the pause begins at that sample.
	n.sample(ctx, l)
	l.g.State, l.g.PausedAt = session.Paused, l.g.SampledAt
	op.land = n.saveLater(l)
	return nil
}

// Resume thaws the guest.
func (n *Node) Resume(ctx context.Context, s *session.Session) error {
	l, err := n.lookup(s.ID)
	if err != nil {
		return err
	}
	op := lockFor(l, "resume")
	defer op.unlock()
	if l.g.State != session.Paused {
		return &StateError{SessionID: s.ID, State: l.g.State}
	}
	if err := n.Driver.Resume(ctx, l.g.GuestID); err != nil {
		return err
	}
	l.ending.resume()
	n.sample(ctx, l) // bills the pause, and the thaw, as paused: running begins once it runs
	l.g.State, l.g.PausedAt = session.Running, time.Time{}
	l.g.ActivityUntil = time.Time{} // the touch saves the state change too
	op.land = n.touch(l)
	return nil
}

// Resize changes a running or paused session's vCPUs and memory in place, through the
// driver's hypervisor.Resizer (a VM's vCPU and memory hotplug); the session's resources, its
// usage records and the node's used capacity follow. A back end that cannot (the OCI ones)
// refuses, as does the driver for a change it cannot make (a VM's memory only grows).
func (n *Node) Resize(ctx context.Context, s *session.Session, res session.Resources) error {
	if res.VCPU < 1 || res.MemoryMiB < 1 {
		return &session.FieldError{Field: "resources", Message: fmt.Sprintf("vcpu %d and memory_mib %d must both be at least 1", res.VCPU, res.MemoryMiB)}
	}
	rz, ok := n.Driver.(hypervisor.Resizer)
	if !ok {
		return &StateError{SessionID: s.ID, State: session.Running,
			Detail: fmt.Sprintf("the %s back end cannot resize a running guest: the new size applies from the session's next start", n.Driver.Name())}
	}
	l, err := n.lookup(s.ID)
	if err != nil {
		return err
	}
	op := lockFor(l, "resize")
	defer op.unlock()
	if l.g.State != session.Running && l.g.State != session.Paused {
		return &StateError{SessionID: s.ID, State: l.g.State}
	}
	n.sample(ctx, l) // what ran so far is billed at the old size
	if err := rz.Resize(ctx, l.g.GuestID, res.VCPU, res.MemoryMiB); err != nil {
		op.land = n.saveLater(l) // the sample's record, before any flush sends it
		return err
	}
	n.mu.Lock() // the heartbeat reads every guest's resources under n.mu
	l.g.Resources.VCPU, l.g.Resources.MemoryMiB = res.VCPU, res.MemoryMiB
	if res.SizeClass != "" {
		l.g.Resources.SizeClass = res.SizeClass
	}
	n.mu.Unlock()
	op.land = n.saveLater(l)
	return nil
}

// takeSnapshot saves the guest into the node's snapshot directory: with memory when asked and the
// back end can (the guest is checkpointed, then restored: a brief pause), else its writable
// layer only. A memory snapshot is answered once the checkpoint has written it; the guest comes
// back in the background (restoreAfterCheckpoint), holding its lock, so that a call on the
// session waits for it rather than failing.
func (n *Node) takeSnapshot(ctx context.Context, s *session.Session, snapshotID string, memory bool) (hypervisor.SnapshotInfo, error) {
	l, err := n.lookup(s.ID)
	if err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	op := lockFor(l, "snapshot")
	handedOver := false
	defer func() {
		if !handedOver {
			op.unlock()
		}
	}()
	if l.g.State != session.Running {
		return hypervisor.SnapshotInfo{}, &StateError{SessionID: s.ID, State: l.g.State}
	}
	tpl, err := n.template(l.g.Template)
	if err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	dir, err := n.snapshotDir(snapshotID)
	if err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	memory = memory && n.keepsMemory()
	if memory && l.direct != nil {
		return hypervisor.SnapshotInfo{}, errDirect(s, "a snapshot with memory, which its agent would quiesce for")
	}
	if !memory {
		info, err := n.Driver.Snapshot(ctx, l.g.GuestID, dir, false)
		return hypervisor.SnapshotInfo{SizeBytes: info.SizeBytes}, err
	}
	// The checkpoint stops the guest. It goes on as a new guest restored from the checkpoint,
	// while the old one is deleted in the background (runsc takes a second or two to reap a
	// sandbox here). The agent stays off until the node creates its resume file (at most
	// quiesceMost): in the new guest's directory after the restore, or in the old one's when
	// the checkpoint failed and the guest runs on; so the checkpoint may take as long as it
	// takes on a loaded host, with no window to lose.
	// The old guest's CPU since its last sample is billed now: the checkpoint stops it, and
	// the guest that goes on has a counter of its own (as the stop's checkpoint does).
	n.sample(ctx, l)
	op.land = n.saveLater(l) // the sample's record, before any flush sends it
	steps := &snapshotSteps{t: time.Now()}
	info, err := n.checkpoint(ctx, l, snapshotID, dir, steps)
	if err != nil {
		if errors.Is(err, errNotQuiesced) {
			return hypervisor.SnapshotInfo{}, err
		}
		// Read whether the caller is still there: a read that could not start (runsc state,
		// under an ended context) is no sign of a stopped guest, and the restart would stop
		// one that runs and lose its processes.
		ictx, icancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		st, ierr := n.Driver.Info(ictx, l.g.GuestID)
		icancel()
		if ierr != nil || st.State == hypervisor.StateStopped {
			return hypervisor.SnapshotInfo{}, n.restartFromDisk(context.WithoutCancel(ctx), l, tpl, snapshotID, err, steps)
		}
		if _, viaDriver := n.Driver.(hypervisor.AgentDialer); !viaDriver {
			_ = n.resumeAgent(l.g.GuestID, resumeFile(snapshotID))
		}
		// Whether the caller is still there: its going away is no sign of the agent's.
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if herr := waitHealthy(hctx, l.agent); herr != nil {
			return hypervisor.SnapshotInfo{}, fmt.Errorf("snapshot: %w; and the agent did not come back: %w", err, herr)
		}
		return hypervisor.SnapshotInfo{}, fmt.Errorf("snapshot: checkpoint: %w", err)
	}
	// The snapshot is whole: it is answered now, and the guest comes back meanwhile (on a
	// loaded 2-core host the restore was 365–505 ms of a snapshot's 642–875). Its directory
	// stays in use until the restore has read it.
	release := n.snapshotsInUse.acquire(snapshotID)
	back := func() {
		defer release()
		defer op.unlock()
		n.restoreAfterCheckpoint(context.WithoutCancel(ctx), l, tpl, snapshotID, dir, info.SizeBytes, steps)
	}
	handedOver = true
	if !n.goBackground(back) {
		back() // the node winds down: it waits for nothing it starts now
	}
	return info, nil
}

// errNotQuiesced is checkpoint's error when the guest's agent did not let go of its socket;
// the guest then runs on, untouched.
var errNotQuiesced = errors.New("snapshot: the agent did not quiesce")

// checkpoint writes l's guest, memory and all, into dir, which stops it. A guest holding a
// host socket cannot be checkpointed: first its agent lets go of its socket, and stays off
// until the node creates its resume file (resumeFile(snapshotID)). An agent reached through
// the driver (a VM's, on vsock) holds no host socket and stays: the driver may need it to
// flush the guest's disks before the snapshot. The caller holds l's lock.
func (n *Node) checkpoint(ctx context.Context, l *live, snapshotID, dir string, steps *snapshotSteps) (hypervisor.SnapshotInfo, error) {
	if l.direct != nil { // no agent to quiesce (a stop that saves it, as a desktop's sleep asks)
		return hypervisor.SnapshotInfo{}, errDirect(&session.Session{ID: l.g.SessionID}, "a snapshot with memory, which its agent would quiesce for")
	}
	if _, viaDriver := n.Driver.(hypervisor.AgentDialer); !viaDriver {
		resume := resumeFile(snapshotID)
		qctx, cancel := context.WithTimeout(ctx, n.quiesceAnswer)
		err := l.agent.QuiesceUntil(qctx, quiesceMost, resume)
		cancel()
		if err != nil {
			// The agent may have quiesced and its answer got lost: the resume file ends that.
			_ = n.resumeAgent(l.g.GuestID, resume)
			return hypervisor.SnapshotInfo{}, fmt.Errorf("%w: %w", errNotQuiesced, err)
		}
	}
	l.agent.Close()
	steps.mark("quiesce")
	// Not cut short by the caller's going away: the save goes on in the sandbox whatever the
	// wait for its answer does, and stops the guest, and without its answer a saved guest
	// was taken for a failed checkpoint, restarted from its disk, its processes lost.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkpointBound)
	defer cancel()
	info, err := n.Driver.Snapshot(sctx, l.g.GuestID, dir, true)
	steps.mark("checkpoint")
	if err != nil {
		_ = removeAll(dir)
	}
	return info, err
}

// checkpointBound bounds a memory snapshot's checkpoint, which its caller's going away does
// not end.
const checkpointBound = 10 * time.Minute

// restoreAfterBound bounds the restore of a guest after its memory snapshot, its agent's
// return included.
const restoreAfterBound = 2 * time.Minute

// restoreAfterCheckpoint brings back the guest that its memory snapshot into dir stopped, as
// a new guest restored from it; should that fail, the session fails (replaceGuest). The
// caller holds l's lock for it (takeSnapshot's), and lets go once it returns.
func (n *Node) restoreAfterCheckpoint(ctx context.Context, l *live, tpl templates.Template, snapshotID, dir string, size int64, steps *snapshotSteps) {
	ctx, cancel := context.WithTimeout(ctx, restoreAfterBound)
	defer cancel()
	err := n.replaceGuest(ctx, l, func(old string) error {
		return n.restoreGuest(ctx, l, tpl, dir, old, resumeFile(snapshotID), steps)
	}, steps)
	if err != nil {
		n.Logger.Error("node: the guest did not come back after its memory snapshot; the session failed",
			"session", l.g.SessionID, "snapshot", snapshotID, "err", err)
		return
	}
	n.Logger.Info("node: memory snapshot taken", append([]any{"session", l.g.SessionID, "snapshot", snapshotID, "bytes", size}, steps.took...)...)
}

// restartFromDisk brings back l's guest, which the failed checkpoint of memory snapshot
// snapshotID stopped (ckptErr), as a new guest booted afresh on its files, as a session
// restored from a disk-only snapshot starts: the stopped guest's writable layer, still on the
// host, is saved as one and restored (restoreGuest). The session goes on running, with its
// files and without its processes; should its disk fail too, the session fails
// (replaceGuest). It answers the snapshot's failure, saying which. The caller holds l's lock.
func (n *Node) restartFromDisk(ctx context.Context, l *live, tpl templates.Template, snapshotID string, ckptErr error, steps *snapshotSteps) error {
	ctx, cancel := context.WithTimeout(ctx, restoreAfterBound)
	defer cancel()
	err := n.replaceGuest(ctx, l, func(old string) error {
		// A guest whose state the driver could not read may still run: its files are saved
		// from it stopped, not while it writes them.
		if err := n.Driver.Stop(ctx, old); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			return fmt.Errorf("stop the guest: %w", err)
		}
		// In the old guest's directory, which goes with it (replaceGuest).
		disk := filepath.Join(n.guestDir(old), "restart")
		if _, err := n.Driver.Snapshot(ctx, old, disk, false); err != nil {
			return fmt.Errorf("save its disk: %w", err)
		}
		steps.mark("disk")
		return n.restoreGuest(ctx, l, tpl, disk, old, "", steps)
	}, steps)
	n.Metrics.checkpointLost(err == nil)
	if err != nil {
		n.Logger.Error("node: a memory snapshot's checkpoint failed and stopped the guest, which could not be restarted from its disk; the session failed",
			"session", l.g.SessionID, "snapshot", snapshotID, "checkpoint_err", ckptErr, "err", err)
		return fmt.Errorf("snapshot: the checkpoint failed and stopped the guest (%w), which could not be restarted from its disk either (%v): the session failed (guest_crash)", ckptErr, err)
	}
	n.Logger.Warn("node: a memory snapshot's checkpoint failed and stopped the guest; the session goes on as a new guest booted from its disk, with its files and without its processes",
		append([]any{"session", l.g.SessionID, "snapshot", snapshotID, "guest", l.g.GuestID, "checkpoint_err", ckptErr}, steps.took...)...)
	return fmt.Errorf("snapshot: the checkpoint failed (%w) and stopped the guest; the session was restarted from its disk: its files are kept, its processes were lost", ckptErr)
}

// replaceGuest replaces l's guest, which a memory snapshot's checkpoint stopped, with the new
// guest restore makes (restoreGuest, given the old guest's id), which it then watches and
// serves egress for. Should restore fail, the session fails (guest_crash: its guest is gone),
// and it answers why. The old guest is deleted in the background once this ends, whatever the
// outcome, and not sooner: a runsc delete takes a second or two of CPU, which the new guest's
// first moments need on a small host. The caller holds l's lock.
func (n *Node) replaceGuest(ctx context.Context, l *live, restore func(old string) error, steps *snapshotSteps) error {
	old := l.g.GuestID
	del := func() {
		bg := context.WithoutCancel(ctx)
		_ = n.Driver.Delete(bg, old)
		_ = removeAll(n.guestDir(old))
	}
	defer func() {
		if !n.goBackground(del) {
			del() // the node winds down: it waits for nothing it starts now
		}
	}()
	if err := restore(old); err != nil {
		// Not the restore's context, which may be what ran out: the end's final sample needs one.
		n.end(context.WithoutCancel(ctx), l, session.Node, session.GuestCrash, "")
		return err
	}
	if l.cancel != nil {
		l.cancel()
	}
	n.watch(l)
	n.startEgress(l)
	steps.mark("watch")
	return nil
}

// restoreGuest restores l's guest, stopped by its checkpoint into dir, as a new guest, and
// waits for its agent, whose quiesce it ends with resume ("": a disk-only snapshot's agent
// boots afresh and waits for none). The caller holds l.mu.
func (n *Node) restoreGuest(ctx context.Context, l *live, tpl templates.Template, dir, old, resume string, steps *snapshotSteps) error {
	// A new guest, whose CPU counter starts at zero: the next sample's delta is from there,
	// not from the old guest's counter (takeSnapshot billed that guest before its checkpoint).
	l.g.GuestID, l.g.CPURaw, l.g.CPUBaseline = randomID("g-"), 0, false
	spec := n.spec(l.g.GuestID, tpl, l.g.Resources)
	restore := n.Driver.Restore
	if a, ok := n.Driver.(hypervisor.LayerAdopter); ok {
		// The new guest takes over the old one's disk: no new disk to make and fill.
		restore = func(ctx context.Context, s hypervisor.Spec, dir string) error {
			return a.RestoreAdopting(ctx, s, dir, old)
		}
	}
	if err := restore(ctx, spec, dir); err != nil {
		return fmt.Errorf("restore the guest: %w", err)
	}
	steps.mark("restore")
	if _, viaDriver := n.Driver.(hypervisor.AgentDialer); !viaDriver && resume != "" {
		// After the restore: the driver mounts the guest's agent dir as it starts.
		if err := n.resumeAgent(l.g.GuestID, resume); err != nil {
			return err
		}
	}
	n.save(l)
	steps.mark("save")
	l.agent, l.proxy = n.agentFor(l.g.GuestID), nil
	if err := waitHealthy(ctx, l.agent); err != nil {
		return fmt.Errorf("the restored guest's agent: %w", err)
	}
	steps.mark("agent_back")
	return nil
}

// snapshotSteps times a memory snapshot's steps, for the log line that says where its time
// went.
type snapshotSteps struct {
	t    time.Time
	took []any
}

func (s *snapshotSteps) mark(step string) {
	s.took = append(s.took, step, time.Since(s.t).Round(time.Microsecond))
	s.t = time.Now()
}

// Stop tears down a session the control plane moved to stopping, and ends it.
func (n *Node) Stop(ctx context.Context, s *session.Session) error {
	_, err := n.stop(ctx, s, "")
	return err
}

// StopSaving is Stop after saving the guest, memory and all, as snapshot snapshotID, where the
// back end can (a desktop's sleep: the guest stops at its checkpoint rather than be restored
// from it only to be torn down). It answers whether memory was saved (false, with nothing
// written, where the back end cannot), the snapshot's size and the root disk image its
// restore needs (hypervisor.SnapshotInfo, as Snapshot answers); the session ends either way,
// and the snapshot is uploaded first when an object store is set (see Snapshot).
func (n *Node) StopSaving(ctx context.Context, s *session.Session, snapshotID string) (hypervisor.SnapshotInfo, error) {
	return n.saved(ctx, snapshotID, func() (hypervisor.SnapshotInfo, error) { return n.stop(ctx, s, snapshotID) })
}

// stop is Stop, saving the guest as snapshot saveAs first when that is set.
func (n *Node) stop(ctx context.Context, s *session.Session, saveAs string) (hypervisor.SnapshotInfo, error) {
	if s.StateReason == nil {
		return hypervisor.SnapshotInfo{}, &session.FieldError{Field: "state_reason", Message: "required: the reason the session is stopping for"}
	}
	// endNow ends a session that has no guest to tear down here.
	endNow := func() error {
		rctx, cancel := n.redis(ctx)
		defer cancel()
		_, err := n.Store.Transition(rctx, store.Change{Project: s.ProjectID, ID: s.ID, From: session.Stopping,
			To: s.StateReason.Terminal(), Driver: session.Node, Reason: *s.StateReason, Rule: deref(s.Rule)})
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			return nil
		}
		return err
	}
	nothingToSave := func(err error) (hypervisor.SnapshotInfo, error) {
		if err == nil && saveAs != "" {
			err = &NoGuestError{SessionID: s.ID}
		}
		return hypervisor.SnapshotInfo{}, err
	}
	l, err := n.lookup(s.ID)
	if err != nil {
		return nothingToSave(endNow()) // never provisioned here, or already gone
	}
	op := lockFor(l, "stop")
	defer op.unlock()
	if l.g.State.Terminal() {
		return nothingToSave(endNow()) // its start failed while the stop was on its way
	}
	if l.g.State == session.Stopping {
		if saveAs != "" {
			return hypervisor.SnapshotInfo{}, &StateError{SessionID: s.ID, State: l.g.State, Detail: "its guest can no longer be saved"}
		}
		return hypervisor.SnapshotInfo{}, nil
	}
	saveFrom := l.g.State
	n.sample(ctx, l)
	l.g.State, l.g.Reason, l.g.Rule = session.Stopping, *s.StateReason, deref(s.Rule)
	var info hypervisor.SnapshotInfo
	switch {
	case saveAs != "" && saveFrom == session.Running && n.keepsMemory():
		// Journalled stopping first: a node that dies during the checkpoint finds the guest
		// stopping, and ends it for the reason given (recover), not as a guest lost. (A
		// back end that keeps no memory saves nothing: no checkpoint, and no journal write
		// under the lock, which took seconds on a loaded host.)
		n.save(l)
		info, err = n.saveBeforeStop(ctx, l, saveAs)
	case saveAs != "" && saveFrom != session.Running:
		err = &StateError{SessionID: s.ID, State: saveFrom, Detail: "only a running guest is saved as it stops; it stops unsaved"}
	}
	op.land = n.saveLater(l)
	n.teardownAsync(l)
	return info, err
}

// keepsMemory answers whether the node's back end saves a guest's memory in its snapshots.
func (n *Node) keepsMemory() bool {
	ms, ok := n.Driver.(hypervisor.MemorySnapshotter)
	return ok && ms.MemorySnapshots()
}

// saveBeforeStop checkpoints l's guest, memory and all, into snapshot snapshotID as it
// stops (the back end keeps memory: keepsMemory), and answers it as the back end does (with
// the root disk image its restore needs). The caller holds l's lock.
func (n *Node) saveBeforeStop(ctx context.Context, l *live, snapshotID string) (hypervisor.SnapshotInfo, error) {
	dir, err := n.snapshotDir(snapshotID)
	if err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	steps := &snapshotSteps{t: time.Now()}
	info, err := n.checkpoint(ctx, l, snapshotID, dir, steps)
	if err != nil {
		return hypervisor.SnapshotInfo{}, fmt.Errorf("save the guest before it stops: %w", err)
	}
	if !info.Memory { // the back end saved the disk alone: not what was asked
		_ = removeAll(dir)
		return hypervisor.SnapshotInfo{}, nil
	}
	n.Logger.Info("node: memory saved; the guest stops", append([]any{"session", l.g.SessionID, "snapshot", snapshotID, "bytes", info.SizeBytes}, steps.took...)...)
	return info, nil
}

// Retime takes a session's new timers from a PATCH and enforces them from now on. It refuses
// timers outside the session's tier (a *session.FieldError), a session it holds no guest for
// (*NoGuestError: not placed here, or not yet) and one whose guest is stopping or ended here
// (*StateError): the gateway then keeps the timers the node enforces.
func (n *Node) Retime(_ context.Context, s *session.Session) error {
	l, err := n.lookup(s.ID)
	if err != nil {
		return err
	}
	op := lockFor(l, "retime")
	defer op.unlock()
	switch l.g.State {
	case session.Provisioning, session.Running, session.Paused:
	default:
		return &StateError{SessionID: s.ID, State: l.g.State, Detail: "its timers can no longer change"}
	}
	tier, err := n.Tiers.Tier(l.g.Tier)
	if err != nil {
		return err
	}
	if err := tier.ValidateTimeouts(s.IdleTimeoutS, s.MaxLifetimeS); err != nil {
		return err
	}
	if l.g.MaxLifetimeS != s.MaxLifetimeS {
		l.g.LifeWarned = false
	}
	if l.g.IdleTimeoutS != s.IdleTimeoutS {
		l.g.IdleWarned = false
	}
	l.g.IdleTimeoutS, l.g.MaxLifetimeS = s.IdleTimeoutS, s.MaxLifetimeS
	op.land = n.saveLater(l)
	return nil
}

// NoGuestError is an operation on a session the node holds no guest for: never provisioned
// here, not yet, or already removed.
type NoGuestError struct{ SessionID string }

func (e *NoGuestError) Error() string { return "node: no guest for session " + e.SessionID }

// StateError is an operation the state of the session's guest here does not allow; the
// message names the state.
type StateError struct {
	SessionID string
	State     session.State
	Detail    string // why the state does not allow it, when the state alone does not say
}

func (e *StateError) Error() string {
	msg := fmt.Sprintf("node: session %s is %s here", e.SessionID, e.State)
	if e.Detail != "" {
		msg += "; " + e.Detail
	}
	return msg
}

// end stops the guest for reason, as driver: to stopping and then its terminal state, or
// straight to the terminal state where the contract says so (OOM, a dead guest). It records
// the transition and leaves the teardown and the Redis writes to the background, so that a
// timer never waits on them. The caller holds l.mu.
func (n *Node) end(ctx context.Context, l *live, driver session.Driver, reason session.Reason, rule string) {
	g := l.g
	next, err := session.Next(g.State, driver, reason)
	if err != nil {
		n.Logger.Error("node: cannot end session", "session", g.SessionID, "err", err)
		return
	}
	// The state's end. To stopping without the counters: the timers call end for every guest
	// in turn, and a loaded host's read took seconds; the teardown's final meter reads them
	// for both. Straight to a terminal state there is no final meter.
	if next.Terminal() {
		l.stopEgress() // before the meter, which then bills every byte that went out
		n.sample(ctx, l)
	} else {
		n.sampleWith(l, withoutCounters)
	}
	g.Pending = append(g.Pending, pending{Kind: "transition", From: g.State, To: next, Driver: driver, Reason: reason, Rule: rule, At: n.Now()})
	g.State, g.Reason, g.Rule = next, reason, rule
	// Taken, not written: the flush lands it before it sends Redis the transition, and the
	// teardown before it kills the guest. The timers, which call end for every guest in turn,
	// never wait on the disk (a saturated one took seconds a write).
	n.saveLater(l)
	n.flushAsync(l)
	n.teardownAsync(l)
}

func (n *Node) teardownAsync(l *live) {
	n.goBackground(func() { n.teardown(n.ctx, l) })
}

// teardown takes the final meter, kills the guest and records the terminal state at once;
// removing the container (a second or two with runsc) comes after, outside the lock.
func (n *Node) teardown(ctx context.Context, l *live) {
	// The stopping entry lands before the guest is killed: a node that dies in between finds
	// the guest stopping and ends it for the same reason, not as a guest that vanished.
	l.mu.Lock()
	seq := l.jseq
	l.mu.Unlock()
	// Killed even if it did not land (logged): a guest left running for want of a disk would
	// leak. Its transitions wait for the journal (flush).
	_ = n.landJournal(l, seq)
	op := lockFor(l, "teardown")
	g := l.g
	if g.State == session.Stopping {
		// The final meter: stopping bills until here, and the egress proxy stops before it,
		// so that no byte goes out after the meter read the count.
		l.stopEgress()
		n.sample(ctx, l)
	}
	n.kill(ctx, l)
	if g.State == session.Stopping {
		to := g.Reason.Terminal()
		g.Pending = append(g.Pending, pending{Kind: "transition", From: session.Stopping, To: to, Driver: session.Node,
			Reason: g.Reason, Rule: g.Rule, At: n.Now()})
		g.State = to
	}
	n.saveLater(l) // the flush lands it first
	guestID := g.GuestID
	op.unlock()
	n.flush(ctx, l)
	n.remove(ctx, guestID)
	n.pool.kick()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func removeAll(p string) error {
	if err := os.RemoveAll(p); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
