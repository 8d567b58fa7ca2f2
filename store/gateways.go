package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"wb/session"
)

// GatewayForgetAfter is how long a gateway that stopped heartbeating stays registered. Its
// addresses stay denied that long; a gateway that crashed and comes back under a new id is
// registered again at once.
const GatewayForgetAfter = 10 * time.Minute

// GatewayInfo is a gateway's registration: every address it listens or sends from.
type GatewayInfo struct {
	ID          string    `json:"id"`
	Addrs       []string  `json:"addrs"` // URLs, host:port or bare addresses
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// AuthzAddr is the host:port of its ext_authz gRPC service (wb serve --authz-addr), which
	// xds publishes as the endpoints of the wb_ext_authz cluster; empty when it serves none.
	AuthzAddr string `json:"authz_addr,omitempty"`
	// EdgeAddr is the host:port where it serves its API to the Envoys over mutual TLS (wb
	// serve --edge-addr), which xds publishes as the wb_gateway endpoints when the Envoys
	// speak TLS; empty when it serves none.
	EdgeAddr string `json:"edge_addr,omitempty"`
}

// GatewayHeartbeat registers or refreshes a gateway.
func (s *Store) GatewayHeartbeat(ctx context.Context, g GatewayInfo) error {
	if g.ID == "" {
		return &session.FieldError{Field: "id", Message: "gateway id is required"}
	}
	g.HeartbeatAt = s.now().UTC()
	b, _ := json.Marshal(g)
	if err := s.rdb.HSet(ctx, GatewaysKey, g.ID, b).Err(); err != nil {
		return fmt.Errorf("gateway heartbeat %s: %w", g.ID, err)
	}
	return nil
}

// Gateways lists the registered gateways, forgetting those silent for GatewayForgetAfter.
func (s *Store) Gateways(ctx context.Context) ([]GatewayInfo, error) {
	m, err := s.rdb.HGetAll(ctx, GatewaysKey).Result()
	if err != nil {
		return nil, fmt.Errorf("list gateways: %w", err)
	}
	cutoff := s.now().Add(-GatewayForgetAfter)
	out := make([]GatewayInfo, 0, len(m))
	var stale []string
	for id, raw := range m {
		var g GatewayInfo
		if err := json.Unmarshal([]byte(raw), &g); err != nil || g.HeartbeatAt.Before(cutoff) {
			stale = append(stale, id)
			continue
		}
		out = append(out, g)
	}
	if len(stale) > 0 {
		if err := s.rdb.HDel(ctx, GatewaysKey, stale...).Err(); err != nil {
			return out, fmt.Errorf("forget stale gateways: %w", err)
		}
	}
	return out, nil
}

// RemoveGateway forgets a gateway that is shutting down.
func (s *Store) RemoveGateway(ctx context.Context, id string) error {
	return s.rdb.HDel(ctx, GatewaysKey, id).Err()
}
