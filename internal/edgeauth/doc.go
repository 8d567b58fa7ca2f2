// Package edgeauth signs and verifies the short grants that carry trust across the edge:
// the header ext_authz adds so that a node accepts exec, PTY and file traffic that Envoy
// routed to it straight (HeaderEdgeAuth), and the connect tokens in a session's connect URLs.
//
// A grant is a small JSON object (session, project, node, whether the caller came by connect
// token, expiry) and an HMAC-SHA256 over it, keyed by a secret that the gateways and nodes
// share and by the grant's purpose, so that a token of one purpose never passes for another. Grants are short-lived by design: there is
// nothing to revoke, a grant simply expires.
package edgeauth
