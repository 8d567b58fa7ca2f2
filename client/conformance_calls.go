package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// GetSessionJSON answers a session as the API's JSON, unparsed: for checks of the wire itself
// (the conformance suite's "session object, field by field" rows tell a null field from a
// missing one, which the typed Session cannot).
func (c *Client) GetSessionJSON(ctx context.Context, id string) (json.RawMessage, error) {
	var raw json.RawMessage
	return raw, c.do(ctx, http.MethodGet, "/v1/sessions/"+pathID(id), nil, nil, &raw)
}
