package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// NodeInfo is a node's registration and its latest heartbeat.
type NodeInfo struct {
	ID     string `json:"id"`
	Addr   string `json:"addr"` // where its exec/pty/files API listens
	Region string `json:"region"`
	Zone   string `json:"zone"`
	Tiers  []int  `json:"tiers"`
	// Capacity and what its guests use now.
	VCPU          int       `json:"vcpu"`
	MemoryMiB     int       `json:"memory_mib"`
	UsedVCPU      int       `json:"used_vcpu"`
	UsedMemoryMiB int       `json:"used_memory_mib"`
	HeartbeatAt   time.Time `json:"heartbeat_at"`
	// Draining: the node takes no new sessions; the edge (xds) marks its endpoint DRAINING.
	Draining bool `json:"draining,omitempty"`
	// Images names the root disk images the node has (hypervisor.RootImager): a memory
	// snapshot that needs one (session.SnapshotRecord.RootImage) is restored only on a node
	// that names it. Absent from a node of an earlier wb, or of a back end without such
	// images; an earlier reader ignores it.
	Images []string `json:"images,omitempty"`
	// HeartbeatEvery is how often the node beats (Heartbeat's caller says; not recorded): its
	// room (nodeRoomKey) lapses roomBeats of them after the heartbeat that wrote it. Zero:
	// defaultHeartbeatEvery.
	HeartbeatEvery time.Duration `json:"-"`
	// Projects is what the guests of each project hold of UsedVCPU and UsedMemoryMiB, as the
	// heartbeat reports them: they go to the node's room only (nodeRoomKey), where the claim
	// script checks a project's share of the node against them.
	Projects map[string]NodeUse `json:"-"`
}

// roomBeats is how many heartbeats a node's room outlives the one that wrote it: a few
// heartbeats lost or late keep it, and a node that writes it no more (stopped, or rolled
// back to a wb that does not) loses it soon, and its claims are judged by the placer's
// read again, as before the room was recorded, not by its last room for good.
const roomBeats = 5

// defaultHeartbeatEvery is a node's default heartbeat period (node.Config.Heartbeat).
const defaultHeartbeatEvery = 2 * time.Second

// Heartbeat registers or refreshes a node. Its capacity and use go to the node's room too
// (nodeRoomKey), where the claim script reads them, for roomBeats of its heartbeats; a
// heartbeat that answers an error may have written either, and the next writes both.
func (s *Store) Heartbeat(ctx context.Context, n NodeInfo) error {
	if n.ID == "" {
		return &session.FieldError{Field: "id", Message: "node id is required"}
	}
	n.HeartbeatAt = s.now().UTC()
	every := n.HeartbeatEvery
	if every <= 0 {
		every = defaultHeartbeatEvery
	}
	b, _ := json.Marshal(n)
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, NodesKey, n.ID, b)
		room := nodeRoomKey(n.ID)
		p.HSet(ctx, room, "vcpu", n.VCPU, "memory_mib", n.MemoryMiB,
			"used_vcpu", n.UsedVCPU, "used_memory_mib", n.UsedMemoryMiB, "projects", roomProjects(n.Projects))
		p.PExpire(ctx, room, roomBeats*every)
		return nil
	}); err != nil {
		return fmt.Errorf("heartbeat %s: %w", n.ID, err)
	}
	return nil
}

// roomProjects is the room's projects field: ";" then "project:vcpu:memory_mib;" for each
// project, which the claim script finds by its project's name. One field, written in one
// HSET with the rest: a project gone from the node is gone from it.
func roomProjects(use map[string]NodeUse) string {
	var b strings.Builder
	b.WriteByte(';')
	for p, u := range use {
		fmt.Fprintf(&b, "%s:%d:%d;", p, u.VCPU, u.MemoryMiB)
	}
	return b.String()
}

// Nodes lists every registered node, each with whether an operator is draining it.
func (s *Store) Nodes(ctx context.Context) ([]NodeInfo, error) {
	var all *redis.MapStringStringCmd
	var draining *redis.StringSliceCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, NodesKey)
		draining = p.SMembers(ctx, NodesDrainingKey)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return nodesFrom(all.Val(), draining.Val())
}

// nodesFrom reads the nodes hash (NodesKey) and the ids of draining nodes.
func nodesFrom(all map[string]string, draining []string) ([]NodeInfo, error) {
	out := make([]NodeInfo, 0, len(all))
	for id, raw := range all {
		var n NodeInfo
		if err := json.Unmarshal([]byte(raw), &n); err != nil {
			return nil, fmt.Errorf("node %s: %w", id, err)
		}
		n.Draining = n.Draining || slices.Contains(draining, id)
		out = append(out, n)
	}
	return out, nil
}

// SetNodeDraining starts (on) or ends (off) an operator's drain of a node: a draining node
// takes no new sessions and the edge sends it no new connections, while the sessions it runs
// go on. The node need not be registered yet.
func (s *Store) SetNodeDraining(ctx context.Context, id string, on bool) error {
	if id == "" {
		return &session.FieldError{Field: "id", Message: "node id is required"}
	}
	var err error
	if on {
		err = s.rdb.SAdd(ctx, NodesDrainingKey, id).Err()
	} else {
		err = s.rdb.SRem(ctx, NodesDrainingKey, id).Err()
	}
	if err != nil {
		return fmt.Errorf("drain node %s: %w", id, err)
	}
	return nil
}

// RemoveNode forgets a node.
func (s *Store) RemoveNode(ctx context.Context, id string) error {
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, NodesKey, id)
		p.Del(ctx, nodeRoomKey(id))
		return nil
	}); err != nil {
		return fmt.Errorf("remove node %s: %w", id, err)
	}
	return nil
}
