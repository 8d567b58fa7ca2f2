//go:build linux

package main

import (
	"context"
	"slices"
	"testing"

	"wb/agent"
	"wb/gateway"
	"wb/hypervisor"
	"wb/session"
)

// recordingGuests notes the sessions each call was for.
type recordingGuests struct{ calls *[]string }

func (r recordingGuests) note(s *session.Session, call string) {
	*r.calls = append(*r.calls, call+" "+s.ID)
}

func (r recordingGuests) Exec(_ context.Context, s *session.Session, _ session.ExecRequest, _ []string, _ func(session.ExecChunk) error) (session.ExecResult, error) {
	r.note(s, "exec")
	return session.ExecResult{}, nil
}

func (r recordingGuests) Agent(_ context.Context, s *session.Session) (*agent.Client, error) {
	r.note(s, "agent")
	return nil, nil
}

func (r recordingGuests) Touch(s *session.Session) { r.note(s, "touch") }

func (r recordingGuests) Retime(_ context.Context, s *session.Session) error {
	r.note(s, "retime")
	return nil
}

func (r recordingGuests) Pause(_ context.Context, s *session.Session) error {
	r.note(s, "pause")
	return nil
}

func (r recordingGuests) Resume(_ context.Context, s *session.Session) error {
	r.note(s, "resume")
	return nil
}

func (r recordingGuests) Snapshot(_ context.Context, s *session.Session, _ string, _ bool) (hypervisor.SnapshotInfo, error) {
	r.note(s, "snapshot")
	return hypervisor.SnapshotInfo{}, nil
}

func (r recordingGuests) Stop(_ context.Context, s *session.Session) error {
	r.note(s, "stop")
	return nil
}

func (r recordingGuests) StopSaving(_ context.Context, s *session.Session, _ string) (hypervisor.SnapshotInfo, error) {
	r.note(s, "stop saving")
	return hypervisor.SnapshotInfo{}, nil
}

func (r recordingGuests) DeleteSnapshot(_ context.Context, id string) error {
	*r.calls = append(*r.calls, "delete snapshot "+id)
	return nil
}

// TestEmbeddedGuests: wb serve's gateway reaches the guests of its own node in process and
// every other node's (and a session never placed) over the node API, for every call.
func TestEmbeddedGuests(t *testing.T) {
	var local, remote []string
	g := embeddedGuests{nodeID: "node_local", local: recordingGuests{&local}, remote: recordingGuests{&remote}}
	ctx := context.Background()
	all := func(s *session.Session) {
		_, _ = g.Exec(ctx, s, session.ExecRequest{}, nil, nil)
		_, _ = g.Agent(ctx, s)
		g.Touch(s)
		_ = g.Retime(ctx, s)
		_ = g.Pause(ctx, s)
		_ = g.Resume(ctx, s)
		_, _ = g.Snapshot(ctx, s, "snap_x", true)
		_ = g.Stop(ctx, s)
	}
	all(&session.Session{ID: "sess_here", NodeID: "node_local"})
	all(&session.Session{ID: "sess_there", NodeID: "node_b"})
	all(&session.Session{ID: "sess_unplaced"})
	want := func(id string) []string {
		var out []string
		for _, c := range []string{"exec", "agent", "touch", "retime", "pause", "resume", "snapshot", "stop"} {
			out = append(out, c+" "+id)
		}
		return out
	}
	// The gateway finds the removal of a snapshot's files as an optional method of its Guests;
	// it goes to every node, through their API.
	d, ok := gateway.Guests(g).(interface {
		DeleteSnapshot(ctx context.Context, id string) error
	})
	if !ok {
		t.Fatal("the gateway's guests cannot delete a snapshot's files")
	}
	_ = d.DeleteSnapshot(ctx, "snap_x")
	if got, w := local, want("sess_here"); !slices.Equal(got, w) {
		t.Errorf("in process: %v, want %v", got, w)
	}
	if got, w := remote, append(append(want("sess_there"), want("sess_unplaced")...), "delete snapshot snap_x"); !slices.Equal(got, w) {
		t.Errorf("over the node API: %v, want %v", got, w)
	}
}
