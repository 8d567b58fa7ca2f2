package gateway

import (
	"context"
	"testing"

	"wb/session"
	"wb/store"
)

// TestAdminDrainNode: the operator lists the nodes and drains one; the drain is in the
// store (where the placer and xds read it) and ends the same way. A tenant's key, an
// unknown node and a body without "draining" are refused.
func TestAdminDrainNode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, id := range []string{"node_b", "node_a"} {
		if err := e.st.Heartbeat(ctx, store.NodeInfo{ID: id, Addr: "http://127.0.0.1:1", Region: "local", Tiers: []int{2}}); err != nil {
			t.Fatal(err)
		}
	}
	expectError(t, e.do("GET", "/v1/admin/nodes", e.key, nil), 401, "unauthenticated", "")
	expectError(t, e.do("PUT", "/v1/admin/nodes/node_a/draining", e.key, map[string]any{"draining": true}), 401, "unauthenticated", "")
	var list session.List[Node]
	e.mustDo("GET", "/v1/admin/nodes", adminKey, nil, 200, &list)
	var ids []string
	for _, n := range list.Data {
		ids = append(ids, n.ID)
	}
	if len(ids) < 2 || ids[0] > ids[1] {
		t.Fatalf("nodes listed %v, want node_a and node_b by id", ids)
	}
	var n Node
	e.mustDo("PUT", "/v1/admin/nodes/node_a/draining", adminKey, map[string]any{"draining": true}, 200, &n)
	if !n.Draining || n.Object != "node" || n.ID != "node_a" {
		t.Fatalf("answer %+v, want node_a draining", n)
	}
	draining := func() bool {
		ns, err := e.st.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.ID == "node_a" {
				return n.Draining
			}
		}
		t.Fatal("node_a is gone")
		return false
	}
	if !draining() {
		t.Fatal("the store does not say node_a is draining")
	}
	var ended Node
	e.mustDo("PUT", "/v1/admin/nodes/node_a/draining", adminKey, map[string]any{"draining": false}, 200, &ended)
	if ended.Draining || ended.ID != "node_a" || draining() {
		t.Fatal("the drain did not end")
	}
	expectError(t, e.do("PUT", "/v1/admin/nodes/node_a/draining", adminKey, map[string]any{}), 400, "invalid_request", "draining")
	expectError(t, e.do("PUT", "/v1/admin/nodes/node_zz/draining", adminKey, map[string]any{"draining": true}), 404, "not_found", "")
}
