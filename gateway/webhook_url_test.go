package gateway

import (
	"testing"

	"wb/internal/redistest"
	"wb/webhooks"
)

// TestWebhookURLMustBePublic: by default a webhook URL on loopback, a private range or the
// metadata address is refused at registration, 400 naming url; local testing needs
// `wb serve --allow-private-webhooks`.
func TestWebhookURLMustBePublic(t *testing.T) {
	rdb := redistest.Server(t)
	e := newEnvOn(t, rdb, func(c *Config) { c.Webhooks = webhooks.NewRegistry(rdb) })
	for _, u := range []string{"http://127.0.0.1:22/", "http://[::1]:22/", "http://0x7f000001:22/", "http://localhost:22/",
		"http://169.254.169.254/latest/", "http://10.0.0.1/"} {
		expectError(t, e.do("POST", "/v1/webhook_endpoints", e.key, map[string]any{"url": u, "events": []string{"session.running"}}), 400, "invalid_request", "url")
	}
}
