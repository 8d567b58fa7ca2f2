package edgeauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// TestSignSpelling: Sign's value is "v1.", the URL-safe base64 of json.Marshal's encoding of
// the grant, ".", and that of its HMAC, byte for byte as it was spelled before Sign wrote it in
// one buffer: for strings that need JSON's escapes, long ones, and each optional field set
// or not.
func TestSignSpelling(t *testing.T) {
	s := signer(t, PurposeConnect)
	strs := []string{"sess_0VcshxiO0jXQa7BIGU", "", `a " quote`, `a \ backslash`, "a<b>&c", "ctl\t\x00", "é 日本", "bad \xff", strings.Repeat("x", 700)}
	for i, a := range strs {
		for _, g := range []Grant{
			{SessionID: a, ProjectID: strs[(i+1)%len(strs)], Expires: 4102444800},
			{SessionID: a, ProjectID: a, NodeID: strs[(i+2)%len(strs)] + "n", ByToken: true, Expires: -int64(i)},
			{SessionID: a, ProjectID: "p", ByToken: true},
		} {
			payload, err := json.Marshal(g)
			if err != nil {
				t.Fatal(err)
			}
			p := base64.RawURLEncoding.EncodeToString(payload)
			m := hmac.New(sha256.New, s.key)
			m.Write([]byte(p))
			want := version + "." + p + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
			if got := s.Sign(g); got != want {
				t.Errorf("Sign(%+v)\n%s\nwant\n%s", g, got, want)
			}
		}
	}
}
