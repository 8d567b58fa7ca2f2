//go:build linux

package main

import (
	"context"

	"wb/agent"
	"wb/gateway"
	"wb/hypervisor"
	"wb/session"
)

// embeddedGuests is what `wb serve`'s gateway calls the guests through: those of its
// embedded node in process (node.Local, as the node's own edge data path does in a fleet),
// those of any other node over its API. Through the embedded node's API, each exec was a
// second HTTP exchange on loopback after the caller's (a connection, a request written and
// parsed, the answer streamed twice): about 1 ms of a runsc exec's 4 ms overhead here.
type embeddedGuests struct {
	nodeID string // the embedded node's
	local  gateway.Guests
	remote nodeGuests
}

// nodeGuests is the guests of every node over the node API (*nodeclient.Client): what the
// gateway asks of a session's node, and the removal of a snapshot's files wherever they are.
type nodeGuests interface {
	gateway.Guests
	DeleteSnapshot(ctx context.Context, id string) error
}

var _ nodeGuests = embeddedGuests{}

func (g embeddedGuests) of(s *session.Session) gateway.Guests {
	if s.NodeID == g.nodeID {
		return g.local
	}
	return g.remote
}

func (g embeddedGuests) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, argv []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	return g.of(s).Exec(ctx, s, req, argv, out)
}

func (g embeddedGuests) Agent(ctx context.Context, s *session.Session) (*agent.Client, error) {
	return g.of(s).Agent(ctx, s)
}

func (g embeddedGuests) Touch(s *session.Session) { g.of(s).Touch(s) }

func (g embeddedGuests) Retime(ctx context.Context, s *session.Session) error {
	return g.of(s).Retime(ctx, s)
}

func (g embeddedGuests) Pause(ctx context.Context, s *session.Session) error {
	return g.of(s).Pause(ctx, s)
}

func (g embeddedGuests) Resume(ctx context.Context, s *session.Session) error {
	return g.of(s).Resume(ctx, s)
}

func (g embeddedGuests) Snapshot(ctx context.Context, s *session.Session, snapshotID string, memory bool) (hypervisor.SnapshotInfo, error) {
	return g.of(s).Snapshot(ctx, s, snapshotID, memory)
}

func (g embeddedGuests) Stop(ctx context.Context, s *session.Session) error {
	return g.of(s).Stop(ctx, s)
}

func (g embeddedGuests) StopSaving(ctx context.Context, s *session.Session, snapshotID string) (hypervisor.SnapshotInfo, error) {
	return g.of(s).StopSaving(ctx, s, snapshotID)
}

// DeleteSnapshot removes a snapshot's files from every node that has them, the embedded one
// among them (the gateway looks for this method on its Guests).
func (g embeddedGuests) DeleteSnapshot(ctx context.Context, id string) error {
	return g.remote.DeleteSnapshot(ctx, id)
}
