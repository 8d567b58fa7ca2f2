package webhooks

import "strings"

// keys names the Redis keys of one project's webhooks. Like the store's, they carry the
// project as hash tag ("wb:{PROJECT}:wh:…"), so every command and script here touches one
// Redis Cluster slot.
type keys struct{ p string }

func projectKeys(project string) keys { return keys{"wb:{" + project + "}:wh:"} }

// endpoints is a hash: endpoint id → endpoint JSON, secret included.
func (k keys) endpoints() string { return k.p + "endpoints" }

// log is a stream of the endpoint's delivery attempts, trimmed to MaxLogEntries.
func (k keys) log(endpoint string) string { return k.p + "log:" + endpoint }

// due is a sorted set of queue names ("ENDPOINT/SESSION"); the score is the time in ms at
// which the queue's head may next be attempted, or the end of the lease of the dispatcher
// that is attempting it.
func (k keys) due() string { return k.p + "due" }

// queue is a list of pending deliveries to one endpoint for one session (session "" for
// project-wide events), oldest first; the head is the one being attempted.
func (k keys) queue(name string) string { return k.p + "q:" + name }

// meta is a hash holding the head's attempt count and first attempt time.
func (k keys) meta(name string) string { return k.p + "qm:" + name }

// owner holds the dispatcher that consumes the project's outbox, with a TTL.
func (k keys) owner() string { return k.p + "owner" }

// queueName names the queue of (endpoint, session).
func queueName(endpoint, sessionID string) string { return endpoint + "/" + sessionID }

// queueEndpoint is the endpoint part of a queue name.
func queueEndpoint(name string) string {
	endpoint, _, _ := strings.Cut(name, "/")
	return endpoint
}
