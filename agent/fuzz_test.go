package agent

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"wb/session"
)

// FuzzExecRequest feeds arbitrary bodies to the exec request decoder: it never panics, every
// refusal is a 400 with a code and a message, and what it accepts is runnable.
func FuzzExecRequest(f *testing.F) {
	for _, seed := range []string{
		`{"argv":["echo","hi"]}`,
		`{"argv":["sh","-c","exit 3"],"env":{"A":"b"},"cwd":"sub","stdin":"aGk=","timeout_s":5}`,
		`{"argv":["x"],"cwd":"/abs","timeout_s":3600}`,
		`{}`, `null`, `[]`, `"x"`, `{"argv":[]}`, `{"argv":[""]}`, `{"argv":[1]}`,
		`{"argv":["x"],"timeout_s":-5}`, `{"argv":["x"],"timeout_s":1e99}`,
		`{"argv":["x"],"env":{"":"v"}}`, `{"argv":["x"],"stdin":"!!"}`,
		`{"argv":["a\u0000"]}`, `{"argv":["x"]}garbage`, "\xff\xfe", ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		const root = "/workspace"
		spec, err := decodeExecRequest(body, root)
		if err != nil {
			if err.Status != 400 || err.Code == "" || err.Message == "" {
				t.Fatalf("refusal %+v", err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if len(spec.argv) == 0 || spec.argv[0] == "" {
			t.Fatalf("accepted argv %q", spec.argv)
		}
		if spec.timeout <= 0 || spec.timeout.Seconds() > session.ExecTimeoutMaxS {
			t.Fatalf("accepted timeout %v", spec.timeout)
		}
		if !filepath.IsAbs(spec.dir) {
			t.Fatalf("accepted relative dir %q", spec.dir)
		}
		if len(spec.stdin) > session.MaxStdinBytes {
			t.Fatalf("accepted %d bytes of stdin", len(spec.stdin))
		}
	})
}
