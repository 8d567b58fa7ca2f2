// Package nodeapi is the node's HTTP API as Go types: its paths, every request and answer
// body, and its error body. The node (node.Handler) serves them and the control plane's
// client (node/client) sends them, so the two sides cannot drift apart; a refusal keeps its
// HTTP status and code from the node to the gateway as an *Error. It imports only session
// and the standard library, so that either side can use it.
package nodeapi
