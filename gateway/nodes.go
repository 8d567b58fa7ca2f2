package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"wb/session"
	"wb/store"
)

// Node is a node as the operator sees it: its registration, its latest heartbeat, and
// whether it is being drained.
type Node struct {
	Object string `json:"object"` // "node"
	store.NodeInfo
}

// NodeDrain is the body of PUT /v1/admin/nodes/{id}/draining.
type NodeDrain struct {
	Draining bool `json:"draining"`
}

// adminListNodes answers every registered node, by id.
func (s *Server) adminListNodes(w http.ResponseWriter, r *http.Request) error {
	ns, err := s.Store.Nodes(r.Context())
	if err != nil {
		return err
	}
	slices.SortFunc(ns, func(a, b store.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
	out := session.List[Node]{Object: "list", Data: make([]Node, 0, len(ns))} // one page: a fleet is small
	for _, n := range ns {
		out.Data = append(out.Data, Node{Object: "node", NodeInfo: n})
	}
	writeJSON(w, 200, out)
	return nil
}

// adminDrainNode starts or ends a node's drain: a draining node takes no new session (the
// placer skips it) and the edge marks its endpoint DRAINING, while its sessions go on.
func (s *Server) adminDrainNode(w http.ResponseWriter, r *http.Request) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	var req NodeDrain
	if err := decodeStrict(b, &req); err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(b, &fields) // decodeStrict took it: an object
	if _, ok := fields["draining"]; !ok {
		return &session.FieldError{Field: "draining", Message: "is required: true to drain the node, false to end its drain"}
	}
	id := r.PathValue("id")
	ns, err := s.Store.Nodes(r.Context())
	if err != nil {
		return err
	}
	i := slices.IndexFunc(ns, func(n store.NodeInfo) bool { return n.ID == id })
	if i < 0 {
		return &apiError{Status: 404, Type: "not_found", Code: "not_found", Message: fmt.Sprintf("no node %q is registered; GET /v1/admin/nodes lists them", id)}
	}
	if err := s.Store.SetNodeDraining(r.Context(), id, req.Draining); err != nil {
		return err
	}
	n := ns[i]
	n.Draining = req.Draining
	writeJSON(w, 200, Node{Object: "node", NodeInfo: n})
	return nil
}
