package suite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"wb/client"
)

// Env is what a check works with: the SDK's client, the mode and its timers, and helpers that
// record what they make so that it is deleted when the row (or, for shared setups, the run)
// ends.
type Env struct {
	C      *client.Client
	Long   bool
	Timers Timers

	suite       *suiteState
	own         tracker
	sharedOwner bool // a shared setup's Env: what it makes lives until the run ends
}

func (e *Env) tracker() *tracker {
	if e.sharedOwner {
		return &e.suite.shared
	}
	return &e.own
}

// Tag is the end_user_id of the suite's sessions in this run.
func (e *Env) Tag() string { return e.suite.tag }

// CreateSession creates a session (tagged with the run's end user unless req names one) and
// records it for deletion.
func (e *Env) CreateSession(ctx context.Context, req client.CreateSessionRequest) (*client.Session, error) {
	if req.Tier == 0 {
		req.Tier = 2
	}
	if req.EndUserID == "" {
		req.EndUserID = e.Tag()
	}
	s, err := e.C.CreateSession(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("create a tier %d session: %w", req.Tier, err)
	}
	e.tracker().add(&e.tracker().sessions, s.ID)
	return s, nil
}

// Running creates a session and waits for it to run.
func (e *Env) Running(ctx context.Context, req client.CreateSessionRequest) (*client.Session, error) {
	s, err := e.CreateSession(ctx, req)
	if err != nil {
		return nil, err
	}
	return e.WaitState(ctx, s.ID, "running")
}

// WaitState polls the session until it is in one of states; a terminal state that is not one
// of them, or the context's end, is an error naming the state it was in.
func (e *Env) WaitState(ctx context.Context, id string, states ...client.SessionState) (*client.Session, error) {
	return e.WaitSession(ctx, id, strings.Join(stateNames(states), " or "), func(s *client.Session) (bool, error) {
		if slices.Contains(states, s.State) {
			return true, nil
		}
		if s.State.Terminal() {
			return false, fmt.Errorf("session %s ended %s (reason %s), never %v", id, s.State, deref(s.StateReason), states)
		}
		return false, nil
	})
}

// WaitSession polls the session until done says so (or fails); what names the condition in
// the error of a context that ends first.
func (e *Env) WaitSession(ctx context.Context, id, what string, done func(*client.Session) (bool, error)) (*client.Session, error) {
	var last *client.Session
	err := poll(ctx, func() (bool, error) {
		s, err := e.C.GetSession(ctx, id)
		if err != nil {
			return false, err
		}
		last = s
		return done(s)
	})
	if err != nil && last != nil && ctx.Err() != nil {
		return last, fmt.Errorf("session %s still %s, not %s: %w", id, last.State, what, err)
	}
	return last, err
}

// poll calls f every 100 ms to 1 s until it says done or fails, or ctx ends.
func poll(ctx context.Context, f func() (bool, error)) error {
	for delay := 100 * time.Millisecond; ; delay = min(delay*2, time.Second) {
		done, err := f()
		if err != nil || done {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Sh runs command in the session and answers its stdout; a non-zero exit is an error.
func (e *Env) Sh(ctx context.Context, id, command string) (string, error) {
	res, err := e.C.Exec(ctx, id, client.ExecRequest{Command: command})
	if err != nil {
		return "", fmt.Errorf("exec %q: %w", command, err)
	}
	if res.ExitCode != 0 {
		return res.Stdout, fmt.Errorf("exec %q exited %d: %s", command, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return res.Stdout, nil
}

// Snapshot snapshots the session, records the snapshot for deletion and waits for it to be
// ready.
func (e *Env) Snapshot(ctx context.Context, id string, memory bool) (*client.Snapshot, error) {
	snap, err := e.C.SnapshotSession(ctx, id, client.SnapshotRequest{IncludeMemory: memory})
	if err != nil {
		return nil, fmt.Errorf("snapshot (include_memory %v): %w", memory, err)
	}
	e.tracker().add(&e.tracker().snapshots, snap.ID)
	err = poll(ctx, func() (bool, error) {
		if snap.State == "ready" {
			return true, nil
		}
		if snap.State == "failed" {
			return false, fmt.Errorf("snapshot %s failed", snap.ID)
		}
		s, err := e.C.GetSnapshot(ctx, snap.ID)
		if err == nil {
			snap = s
		}
		return false, err
	})
	return snap, err
}

// noRoomWait bounds how long the suite retries a call answered 409 no_capacity: no machine
// with room for a desktop now (seed 001), which a loaded deployment answers while the other
// rows' guests hold the room, or while its node's heartbeat is late.
const noRoomWait = 2 * time.Minute

// noRoom reports whether err is the API's 409 no_capacity.
func noRoom(err error) bool {
	e := apiErr(err)
	return e != nil && e.Status == 409 && e.Code == "no_capacity"
}

// retryNoRoom calls f until it is not refused for want of room (refused says so), waiting
// a few seconds between tries, for at most noRoomWait.
func retryNoRoom(ctx context.Context, f func() (refused bool)) error {
	deadline := time.Now().Add(noRoomWait)
	for f() {
		if time.Now().After(deadline) {
			return fmt.Errorf("no machine with room for %s", noRoomWait)
		}
		if err := sleepCtx(ctx, 3*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// withRoom calls move (a desktop's create, wake or start), trying again while no machine has
// room for it.
func withRoom(ctx context.Context, move func() (*client.Desktop, error)) (*client.Desktop, error) {
	var d *client.Desktop
	var err error
	if rerr := retryNoRoom(ctx, func() bool {
		d, err = move()
		return noRoom(err)
	}); rerr != nil {
		return nil, fmt.Errorf("%w: %w", rerr, err) // out of time, with the last refusal
	}
	return d, err
}

// CreateDesktop creates a desktop (trying again while no machine has room) and records it
// for deletion.
func (e *Env) CreateDesktop(ctx context.Context, name string) (*client.Desktop, error) {
	d, err := withRoom(ctx, func() (*client.Desktop, error) {
		return e.C.CreateDesktop(ctx, client.CreateDesktopRequest{Name: name})
	})
	if err != nil {
		return nil, fmt.Errorf("create a desktop: %w", err)
	}
	e.tracker().add(&e.tracker().desktops, d.ID)
	return d, nil
}

// apiStatus answers the HTTP status of an API error (0 for another error or none).
func apiStatus(err error) int {
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		return apiErr.Status
	}
	return 0
}

// apiErr answers the API error in err, or nil.
func apiErr(err error) *client.Error {
	var e *client.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

func stateNames(states []client.SessionState) []string {
	out := make([]string, len(states))
	for i, s := range states {
		out[i] = string(s)
	}
	return out
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
