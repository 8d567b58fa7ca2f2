package node_test

import (
	"errors"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"wb/node/client"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// wantNodeError fails t unless err is a *nodeapi.Error with status and code (and param, when
// not empty).
func wantNodeError(t *testing.T, what string, err error, status int, code, param string) *nodeapi.Error {
	t.Helper()
	var ne *nodeapi.Error
	if !errors.As(err, &ne) || ne.Status != status || ne.Code != code || (param != "" && ne.Param != param) {
		t.Fatalf("%s: %v (%T); want a *nodeapi.Error %d %s %s", what, err, err, status, code, param)
	}
	return ne
}

// TestAPIThroughClient: every request of the node API, sent by the control plane's client to
// the node's handler, does what it says; a refusal reaches the client as a *nodeapi.Error with
// the node's status and code. Retime applies new timers the node then enforces, and refuses
// what it cannot apply.
func TestAPIThroughClient(t *testing.T) {
	t.Parallel()
	for _, rt := range []string{"runc", "cloudhv"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			testAPIThroughClient(t, rt)
		})
	}
}

func testAPIThroughClient(t *testing.T, rt string) {
	const project, token = "proj_api", "tok_api"
	st, _ := newStore(t)
	d := newDriver(t, rt, tempDir(t))
	var offset atomic.Int64
	cfg := nodeConfig(t, st, d, tempDir(t), "node_api")
	cfg.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	srv := httptest.NewUnstartedServer(nil)
	cfg.Info.Addr = "http://" + srv.Listener.Addr().String()
	n := startNode(t, cfg)
	srv.Config.Handler = n.Handler(token)
	srv.Start()
	t.Cleanup(srv.Close)
	c := client.New(st, token)

	// Provision: 202, then the node reports the session running through Redis.
	s := placed(t, st, project, n.Info.ID, sessionOpts{idleS: 3600, lifeS: 3600})
	if err := c.Provision(ctxT(t, 30*time.Second), n.Info, s); err != nil {
		t.Fatalf("provision: %v", err)
	}
	s, _ = waitState(t, st, project, s.ID, 2*time.Minute, session.Running)
	ctx := ctxT(t, 2*time.Minute)
	c.Touch(s)

	// Pause, a second pause (409 naming the state), resume.
	if err := c.Pause(ctx, s); err != nil {
		t.Fatalf("pause: %v", err)
	}
	ne := wantNodeError(t, "a second pause", c.Pause(ctx, s), 409, nodeapi.CodeInvalidState, "")
	if !strings.Contains(ne.Message, "paused") {
		t.Errorf("409 message %q: want it to name the state", ne.Message)
	}
	if err := c.Resume(ctx, s); err != nil {
		t.Fatalf("resume: %v", err)
	}

	// Snapshot (the writable layer), a bad snapshot id, and the snapshot's deletion.
	snapID := session.NewID("snap_", time.Now())
	if info, err := c.Snapshot(ctx, s, snapID, false); err != nil || info.Memory || info.SizeBytes <= 0 {
		t.Fatalf("snapshot: memory %v size %d err %v", info.Memory, info.SizeBytes, err)
	}
	_, err := c.Snapshot(ctx, s, "../x", false)
	wantNodeError(t, "a bad snapshot id", err, 400, nodeapi.CodeInvalidRequest, "snapshot_id")
	if err := c.DeleteSnapshot(ctx, snapID); err != nil {
		t.Fatalf("delete snapshot: %v", err)
	}
	wantNodeError(t, "a delete of a bad snapshot id", c.DeleteSnapshot(ctx, "snap_x"), 400, nodeapi.CodeInvalidRequest, "snapshot_id")

	// A provision the node could only fail later (after a 202, and a failure written to
	// Redis for a session of no id) is refused at once, naming the field.
	noID := *s
	noID.ID = ""
	wantNodeError(t, "a provision without a session id", c.Provision(ctx, n.Info, &noID), 400, nodeapi.CodeInvalidRequest, "id")
	noTemplate := *s
	noTemplate.ID, noTemplate.Template = session.NewID("sess_", time.Now()), ""
	wantNodeError(t, "a provision without a template", c.Provision(ctx, n.Info, &noTemplate), 400, nodeapi.CodeInvalidRequest, "template")

	// Retime: timers outside the tier are refused, as is a session the node does not hold.
	bad := *s
	bad.IdleTimeoutS = 1
	wantNodeError(t, "retime to a 1 s idle timeout", c.Retime(ctx, &bad), 400, nodeapi.CodeInvalidRequest, "idle_timeout_s")
	other := *s
	other.ID = session.NewID("sess_", time.Now())
	wantNodeError(t, "retime of a session the node does not hold", c.Retime(ctx, &other), 404, nodeapi.CodeNotFound, "")
	wantNodeError(t, "a token the node does not know", client.New(st, "tok_wrong").Pause(ctx, s), 401, nodeapi.CodeUnauthenticated, "")

	// A retime the node applies: 20 minutes on, the old lifetime (an hour) would let the
	// session run on; the new one (10 minutes) has ended it.
	short := *s
	short.MaxLifetimeS = 600
	if err := c.Retime(ctx, &short); err != nil {
		t.Fatalf("retime: %v", err)
	}
	offset.Store(int64(20 * time.Minute))
	got, _ := waitState(t, st, project, s.ID, time.Minute, session.Expired)
	if got.StateReason == nil || *got.StateReason != session.MaxLifetime {
		t.Fatalf("ended for %s, want max_lifetime", reasonOf(got))
	}
	// An ended session's timers no longer change: 409 while the node still holds it, 404
	// once it has let go of it.
	err = c.Retime(ctx, &short)
	var refused *nodeapi.Error
	if !errors.As(err, &refused) || (refused.Status != 409 && refused.Status != 404) {
		t.Fatalf("retime of an expired session: %v, want a 409 or 404 *nodeapi.Error", err)
	}

	// Stop: without a reason it is refused; with one the node ends the session.
	s2 := placed(t, st, project, n.Info.ID, sessionOpts{idleS: 3600, lifeS: 3600})
	if err := c.Provision(ctx, n.Info, s2); err != nil {
		t.Fatalf("provision: %v", err)
	}
	s2, _ = waitState(t, st, project, s2.ID, 2*time.Minute, session.Running)
	s2, err = st.Transition(ctx, store.Change{Project: project, ID: s2.ID, From: session.Running, To: session.Stopping,
		Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatal(err)
	}
	noReason := *s2
	noReason.StateReason = nil
	wantNodeError(t, "a stop without a reason", c.Stop(ctx, &noReason), 400, nodeapi.CodeInvalidRequest, "state_reason")
	if err := c.Stop(ctx, s2); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if got, _ := waitState(t, st, project, s2.ID, time.Minute, session.Stopped); got.StateReason == nil || *got.StateReason != session.Deleted {
		t.Fatalf("stopped for %s, want deleted", reasonOf(got))
	}

	// Stop saving the guest (a desktop's sleep): a bad snapshot id is refused, a session the
	// node no longer holds has nothing to save, and a running one is saved, memory and all
	// where the back end can (cloudhv; runc cannot, and saves nothing), as it ends.
	_, err = c.StopSaving(ctx, s2, "../x")
	wantNodeError(t, "a bad snapshot id to save as", err, 400, nodeapi.CodeInvalidRequest, "save_as")
	_, err = c.StopSaving(ctx, s2, session.NewID("snap_", time.Now()))
	if !errors.As(err, &refused) || (refused.Status != 409 && refused.Status != 404) {
		t.Fatalf("stop saving a stopped session: %v, want a 409 or 404 *nodeapi.Error", err)
	}
	s3 := placed(t, st, project, n.Info.ID, sessionOpts{idleS: 3600, lifeS: 3600})
	if err := c.Provision(ctx, n.Info, s3); err != nil {
		t.Fatalf("provision: %v", err)
	}
	s3, _ = waitState(t, st, project, s3.ID, 2*time.Minute, session.Running)
	s3, err = st.Transition(ctx, store.Change{Project: project, ID: s3.ID, From: session.Running, To: session.Stopping,
		Driver: session.Caller, Reason: session.Deleted})
	if err != nil {
		t.Fatal(err)
	}
	// A memory snapshot names the root disk image its restore needs, as Snapshot's does.
	info, err := c.StopSaving(ctx, s3, session.NewID("snap_", time.Now()))
	if mem := info.Memory; err != nil || mem != (rt == "cloudhv") || (info.SizeBytes > 0) != mem || (info.RootImage != "") != mem {
		t.Fatalf("stop saving: %+v err %v; want memory %v", info, err, rt == "cloudhv")
	}
	if got, _ := waitState(t, st, project, s3.ID, time.Minute, session.Stopped); got.StateReason == nil || *got.StateReason != session.Deleted {
		t.Fatalf("stopped saving for %s, want deleted", reasonOf(got))
	}
}
