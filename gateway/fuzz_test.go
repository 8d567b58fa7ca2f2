package gateway

import (
	"errors"
	"testing"

	"wb/session"
)

// FuzzCreateBody: the create-body decoder and validator never panic, and every refusal is a
// 4xx API error with a message.
func FuzzCreateBody(f *testing.F) {
	for _, seed := range []string{
		`{"tier":2}`, `{"tier":1,"resources":{"size_class":"m"}}`, `{"tier":4,"idle_timeout_s":30,"max_lifetime_s":86400}`,
		`{"tier":2,"resources":{"vcpu":2,"memory_mib":4096}}`, `{"tier":1e309}`, `{"tier":-0}`, `[]`, `{`, `{"metadata":{"":""}}`,
		`{"tier":2,"unknown":1}`, `{"tier":2} x`, "\x00",
	} {
		f.Add([]byte(seed))
	}
	tiers := session.DefaultTiers()
	f.Fuzz(func(t *testing.T, body []byte) {
		var req session.CreateRequest
		err := decodeStrict(body, &req)
		if err == nil {
			_, err = req.Validate(tiers)
		}
		if err == nil {
			return
		}
		ae := toAPIError(err)
		var fe *session.FieldError
		if ae.Status < 400 || ae.Status >= 500 || ae.Message == "" {
			t.Fatalf("body %q: %v → %+v", body, err, ae)
		}
		if errors.As(err, &fe) && ae.Param != fe.Field {
			t.Fatalf("param %q, field %q", ae.Param, fe.Field)
		}
	})
}
