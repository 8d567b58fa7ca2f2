package client

import (
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"wb/webhooks"
)

// signed answers the headers the platform's webhooks package sends for body.
func signed(t *testing.T, secret, id string, at time.Time, body []byte) http.Header {
	t.Helper()
	key, err := webhooks.SecretKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(webhooks.HeaderID, id)
	h.Set(webhooks.HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	h.Set(webhooks.HeaderSignature, webhooks.Sign(key, id, at.Unix(), body))
	return h
}

// TestVerifyWebhook: a delivery signed by the platform's own webhooks package verifies and
// decodes; a changed body, another secret, a stale or future timestamp, or a missing header is
// refused with ErrWebhookSignature; one good signature among several suffices.
func TestVerifyWebhook(t *testing.T) {
	secret := webhooks.NewSecret()
	now := time.Now()
	body := []byte(`{"id":"evt_1","type":"session.running","created_at":"2026-01-01T00:00:00.000Z","data":{"object":{"id":"sess_1"}}}`)
	ev, err := VerifyWebhook(secret, signed(t, secret, "evt_1", now, body), body)
	if err != nil {
		t.Fatalf("a delivery signed by package webhooks: %v", err)
	}
	if ev.ID != "evt_1" || ev.Type != "session.running" || string(ev.Data.Object) != `{"id":"sess_1"}` {
		t.Errorf("event %+v", ev)
	}

	multi := signed(t, secret, "evt_1", now, body)
	multi.Set(webhooks.HeaderSignature, "v1,AAAA v2,xyz "+multi.Get(webhooks.HeaderSignature))
	if _, err := VerifyWebhook(secret, multi, body); err != nil {
		t.Errorf("one good signature among several: %v", err)
	}

	missing := signed(t, secret, "evt_1", now, body)
	missing.Del(webhooks.HeaderID)
	for name, tc := range map[string]struct {
		secret string
		h      http.Header
		body   []byte
	}{
		"changed body":   {secret, signed(t, secret, "evt_1", now, body), append([]byte(nil), append(body[:len(body)-1:len(body)-1], ' ', '}')...)},
		"another secret": {webhooks.NewSecret(), signed(t, secret, "evt_1", now, body), body},
		"another id": {secret, func() http.Header {
			h := signed(t, secret, "evt_1", now, body)
			h.Set(webhooks.HeaderID, "evt_2")
			return h
		}(), body},
		"stale timestamp":  {secret, signed(t, secret, "evt_1", now.Add(-10*time.Minute), body), body},
		"future timestamp": {secret, signed(t, secret, "evt_1", now.Add(10*time.Minute), body), body},
		"missing id":       {secret, missing, body},
		"not a secret":     {"whsec_%%%", signed(t, secret, "evt_1", now, body), body},
	} {
		if _, err := VerifyWebhook(tc.secret, tc.h, tc.body); !errors.Is(err, ErrWebhookSignature) {
			t.Errorf("%s: %v, want ErrWebhookSignature", name, err)
		}
	}
}
