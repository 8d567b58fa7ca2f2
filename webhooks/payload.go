package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"wb/session"
	"wb/store"
)

// Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Payload is the JSON body of a delivery.
type Payload struct {
	ID        string       `json:"id"`
	Type      string       `json:"type"`
	CreatedAt session.Time `json:"created_at"`
	Data      PayloadData  `json:"data"`
}

// PayloadData is the payload's data: the object, and why a session stopped or failed.
type PayloadData struct {
	Object json.RawMessage `json:"object"`
	Reason string          `json:"reason,omitempty"`
	Rule   string          `json:"rule,omitempty"`
}

// withReason are the event types whose data carries reason and rule.
func withReason(typ string) bool {
	switch typ {
	case session.EventFailed, session.EventStopped, session.EventExpired, session.EventStopping:
		return true
	}
	return false
}

// BuildPayload renders an outbox event as the body delivered to endpoints.
func BuildPayload(ev store.Event) ([]byte, error) {
	at := ev.AtMs
	if at == 0 {
		ms, _, _ := strings.Cut(ev.StreamID, "-")
		at, _ = strconv.ParseInt(ms, 10, 64)
	}
	p := Payload{ID: ev.ID, Type: ev.Type, CreatedAt: session.Time{Time: time.UnixMilli(at).UTC()},
		Data: PayloadData{Object: json.RawMessage("null")}}
	switch {
	case ev.Session != nil:
		b, err := json.Marshal(ev.Session)
		if err != nil {
			return nil, fmt.Errorf("encode session of event %s: %w", ev.ID, err)
		}
		p.Data.Object = b
	case len(ev.Object) > 0:
		if !json.Valid(ev.Object) {
			return nil, fmt.Errorf("event %s: object is not JSON", ev.ID)
		}
		p.Data.Object = ev.Object
	}
	if withReason(ev.Type) {
		p.Data.Reason, p.Data.Rule = string(ev.Reason), ev.Rule
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", ev.ID, err)
	}
	return b, nil
}

// SecretKey returns the HMAC key of a "whsec_…" secret.
func SecretKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, SecretPrefix))
	if err != nil {
		return nil, fmt.Errorf("webhook secret is not base64: %w", err)
	}
	return key, nil
}

// Sign returns the webhook-signature header value for a delivery: "v1," and the base64 of
// HMAC-SHA256(key, id "." timestamp "." body).
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + strconv.FormatInt(timestamp, 10) + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}
