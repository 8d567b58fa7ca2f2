package webhooks

import (
	"strings"

	"wb/store"
)

// keys are the Redis keys of one project's webhooks, as store/keys.go lays them out (what
// each holds is written there). They carry the project as hash tag, so every command and
// script here touches one Redis Cluster slot.
type keys struct{ wh store.WebhookKeys }

func projectKeys(project string) keys { return keys{store.ProjectKeys(project).Webhooks()} }

func (k keys) endpoints() string          { return k.wh.Endpoints() }
func (k keys) log(endpoint string) string { return k.wh.Log(endpoint) }
func (k keys) due() string                { return k.wh.Due() }
func (k keys) queue(name string) string   { return k.wh.Queue(name) }
func (k keys) meta(name string) string    { return k.wh.QueueMeta(name) }
func (k keys) queued() string             { return k.wh.QueuedBytes() }
func (k keys) owner() string              { return k.wh.Owner() }
func (k keys) again() string              { return k.wh.Again() }

// queueName names the queue of (endpoint, session).
func queueName(endpoint, sessionID string) string { return endpoint + "/" + sessionID }

// queueEndpoint is the endpoint part of a queue name.
func queueEndpoint(name string) string {
	endpoint, _, _ := strings.Cut(name, "/")
	return endpoint
}
