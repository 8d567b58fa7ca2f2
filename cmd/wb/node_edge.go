//go:build linux

package main

import (
	"fmt"
	"net/http"

	"wb/gateway"
	"wb/node"
)

// edgeDataPath puts the edge's data path in front of the node's API on the node's listener:
// exec, PTY and files for requests that carry a grant ext_authz signed for this node (the
// gateway's own handlers, over the node's guests in process); everything else goes to api,
// the node token's API, as before. Close the DataPath when the listener stops.
func edgeDataPath(nd *node.Node, api http.Handler) (*gateway.DataPath, error) {
	cfg := gateway.DataPathConfig{Store: nd.Store, Guests: nd.Local(), NodeID: nd.Info.ID, Fallback: api, Logger: nd.Logger}
	if nd.Metrics != nil {
		// The data path's requests by route and status, on the node's --metrics-addr.
		cfg.Registry = nd.Metrics.Registry()
	}
	dp, err := gateway.NewDataPath(cfg)
	if err != nil {
		return nil, fmt.Errorf("node %s: the edge data path: %w", nd.Info.ID, err)
	}
	return dp, nil
}
