package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// WebhookTolerance is how far a delivery's webhook-timestamp may be from now, either way, for
// VerifyWebhook: older ones are refused as replays.
const WebhookTolerance = 5 * time.Minute

// ErrWebhookSignature is wrapped by every refusal of VerifyWebhook.
var ErrWebhookSignature = errors.New("webhook signature not verified")

// WebhookEvent is the body of a delivery.
type WebhookEvent struct {
	ID        string `json:"id"` // evt_…, also the webhook-id header: deduplicate on it (a quota.exceeded sent again has its first send's id)
	Type      string `json:"type"`
	CreatedAt Time   `json:"created_at"`
	Data      struct {
		Object json.RawMessage `json:"object"` // the session, snapshot or run
		Reason string          `json:"reason,omitempty"`
		Rule   string          `json:"rule,omitempty"`
	} `json:"data"`
}

// VerifyWebhook checks a delivery's Standard Webhooks signature (webhook-id,
// webhook-timestamp, webhook-signature: "v1,<base64 HMAC-SHA256>" entries separated by
// spaces) with the endpoint's whsec_ secret, refuses a timestamp more than WebhookTolerance
// from now, and answers the decoded event. body must be the request's bytes as received.
func VerifyWebhook(secret string, h http.Header, body []byte) (*WebhookEvent, error) {
	return VerifyWebhookAt(secret, h, body, time.Now(), WebhookTolerance)
}

// VerifyWebhookAt is VerifyWebhook at the time now with the given tolerance.
func VerifyWebhookAt(secret string, h http.Header, body []byte, now time.Time, tolerance time.Duration) (*WebhookEvent, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("webhook secret: want the endpoint's whsec_<base64> secret: %w", ErrWebhookSignature)
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return nil, fmt.Errorf("headers webhook-id, webhook-timestamp and webhook-signature are all required: %w", ErrWebhookSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("header webhook-timestamp %q: want Unix seconds: %w", ts, ErrWebhookSignature)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return nil, fmt.Errorf("header webhook-timestamp is %s from now, more than the %s allowed: %w", d.Round(time.Second), tolerance, ErrWebhookSignature)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	want := m.Sum(nil)
	matched := false
	for _, s := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue // another scheme: not ours to check
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			matched = true
			break
		}
	}
	if !matched {
		return nil, fmt.Errorf("no v1 signature in webhook-signature matches the body with this secret: %w", ErrWebhookSignature)
	}
	var ev WebhookEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, fmt.Errorf("webhook body is not an event: %w", err)
	}
	return &ev, nil
}
