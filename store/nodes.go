package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

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
}

// Heartbeat registers or refreshes a node.
func (s *Store) Heartbeat(ctx context.Context, n NodeInfo) error {
	if n.ID == "" {
		return &session.FieldError{Field: "id", Message: "node id is required"}
	}
	n.HeartbeatAt = s.now().UTC()
	b, _ := json.Marshal(n)
	if err := s.rdb.HSet(ctx, NodesKey, n.ID, b).Err(); err != nil {
		return fmt.Errorf("heartbeat %s: %w", n.ID, err)
	}
	return nil
}

// Nodes lists every registered node.
func (s *Store) Nodes(ctx context.Context) ([]NodeInfo, error) {
	m, err := s.rdb.HGetAll(ctx, NodesKey).Result()
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := make([]NodeInfo, 0, len(m))
	for id, raw := range m {
		var n NodeInfo
		if err := json.Unmarshal([]byte(raw), &n); err != nil {
			return nil, fmt.Errorf("node %s: %w", id, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// RemoveNode forgets a node.
func (s *Store) RemoveNode(ctx context.Context, id string) error {
	return s.rdb.HDel(ctx, NodesKey, id).Err()
}
