package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"wb/client"
)

// objectFixture is one tier-2 session watched from its create to running: the create's
// answer, every state seen on the way, and the running session as typed and as raw JSON.
type objectFixture struct {
	created     *client.Session
	seen        []client.SessionState
	startedLeak string // a state before running that had started_at set ("" if none)
	running     *client.Session
	raw         map[string]json.RawMessage
	endUser     string // the end_user_id it was created with
}

func objectSession(ctx context.Context, e *Env) (*objectFixture, error) {
	return shared(ctx, e, "object", func(ctx context.Context, e *Env) (*objectFixture, error) {
		f := &objectFixture{endUser: "eu_" + e.Tag()}
		s, err := e.CreateSession(ctx, client.CreateSessionRequest{Tier: 2, EndUserID: f.endUser,
			IdleTimeoutS: 600, MaxLifetimeS: 1800, Resources: &client.ResourceRequest{SizeClass: "s"}})
		if err != nil {
			return nil, err
		}
		f.created = s
		f.seen = []client.SessionState{s.State}
		f.running, err = e.WaitSession(ctx, s.ID, "running", func(s *client.Session) (bool, error) {
			if f.seen[len(f.seen)-1] != s.State {
				f.seen = append(f.seen, s.State)
			}
			if s.State != "running" && s.StartedAt != nil && f.startedLeak == "" {
				f.startedLeak = string(s.State)
			}
			if s.State.Terminal() {
				return false, fmt.Errorf("session %s ended %s (%s) before running", s.ID, s.State, deref(s.StateReason))
			}
			return s.State == "running", nil
		})
		if err != nil {
			return nil, err
		}
		raw, err := e.C.GetSessionJSON(ctx, s.ID)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &f.raw); err != nil {
			return nil, fmt.Errorf("GET /v1/sessions/%s is not a JSON object: %w", s.ID, err)
		}
		return f, nil
	})
}

// fieldRow checks one field of the running session's raw JSON.
func fieldRow(field, what string, check func(f *objectFixture, v json.RawMessage) (string, error)) Row {
	return Row{Seed: "000", Table: "Session object", Row: field + ": " + what,
		Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := objectSession(ctx, e)
			if err != nil {
				return "", err
			}
			v, ok := f.raw[field]
			if !ok {
				return "", fmt.Errorf("the session object has no field %q", field)
			}
			return check(f, v)
		}}
}

// jsonString answers v as a string, or an error naming field.
func jsonString(field string, v json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("%s is %s, want a string", field, v)
	}
	return s, nil
}

func jsonNumber(field string, v json.RawMessage) (int64, error) {
	var n int64
	if err := json.Unmarshal(v, &n); err != nil {
		return 0, fmt.Errorf("%s is %s, want an integer", field, v)
	}
	return n, nil
}

func jsonObject(field string, v json.RawMessage) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil || m == nil {
		return nil, fmt.Errorf("%s is %s, want an object", field, v)
	}
	return m, nil
}

// jsonTime answers v as an RFC 3339 UTC time with milliseconds (API.md, "Conventions").
func jsonTime(field string, v json.RawMessage) (time.Time, error) {
	s, err := jsonString(field, v)
	if err != nil {
		return time.Time{}, err
	}
	if !timeFormat.MatchString(s) {
		return time.Time{}, fmt.Errorf("%s is %q, want RFC 3339 UTC with milliseconds (2026-10-06T09:14:22.118Z)", field, s)
	}
	return time.Parse(time.RFC3339Nano, s)
}

var (
	timeFormat   = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
	idFormat     = regexp.MustCompile(`^[A-Za-z0-9]+$`)
	templateForm = regexp.MustCompile(`^tpl_[A-Za-z0-9_]+@sha256:[0-9a-f]{6,}`)
)

func hasID(field, prefix string, v json.RawMessage) (string, error) {
	s, err := jsonString(field, v)
	if err != nil {
		return "", err
	}
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || !idFormat.MatchString(rest) {
		return "", fmt.Errorf("%s is %q, want %s + base62", field, s, prefix)
	}
	return fmt.Sprintf("%s %q", field, s), nil
}

func objectRows() []Row {
	return []Row{
		fieldRow("id", `"sess_" + base62`, func(f *objectFixture, v json.RawMessage) (string, error) {
			saw, err := hasID("id", "sess_", v)
			if err == nil && f.created.ID != f.running.ID {
				err = fmt.Errorf("create answered id %s, GET %s", f.created.ID, f.running.ID)
			}
			return saw, err
		}),
		fieldRow("object", `"session"`, func(_ *objectFixture, v json.RawMessage) (string, error) {
			s, err := jsonString("object", v)
			if err == nil && s != "session" {
				err = fmt.Errorf(`object is %q, want "session"`, s)
			}
			return fmt.Sprintf("object %q", s), err
		}),
		fieldRow("tier", "the tier asked for (2)", func(_ *objectFixture, v json.RawMessage) (string, error) {
			n, err := jsonNumber("tier", v)
			if err == nil && n != 2 {
				err = fmt.Errorf("tier %d, asked for 2", n)
			}
			return fmt.Sprintf("tier %d", n), err
		}),
		fieldRow("state", "pending in the create's answer, then running", func(f *objectFixture, v json.RawMessage) (string, error) {
			s, err := jsonString("state", v)
			saw := fmt.Sprintf("create answered %s; later %s", f.created.State, s)
			if err == nil && (f.created.State != "pending" || s != "running") {
				err = fmt.Errorf("want pending, then running")
			}
			return saw, err
		}),
		fieldRow("project_id", `"proj_" + base62`, func(_ *objectFixture, v json.RawMessage) (string, error) {
			return hasID("project_id", "proj_", v)
		}),
		fieldRow("end_user_id", "the end_user_id given at create", func(f *objectFixture, v json.RawMessage) (string, error) {
			s, err := jsonString("end_user_id", v)
			if err == nil && s != f.endUser {
				err = fmt.Errorf("end_user_id %q, created with %q", s, f.endUser)
			}
			return fmt.Sprintf("end_user_id %q", s), err
		}),
		fieldRow("template", "name@sha256:digest", func(_ *objectFixture, v json.RawMessage) (string, error) {
			s, err := jsonString("template", v)
			if err == nil && !templateForm.MatchString(s) {
				err = fmt.Errorf("template %q, want tpl_NAME@sha256:DIGEST", s)
			}
			return fmt.Sprintf("template %q", s), err
		}),
		fieldRow("region", "a region name", func(_ *objectFixture, v json.RawMessage) (string, error) {
			s, err := jsonString("region", v)
			if err == nil && s == "" {
				err = fmt.Errorf("region is empty")
			}
			return fmt.Sprintf("region %q", s), err
		}),
		fieldRow("zone", "the zone placed in (a string once placed, or null)", func(_ *objectFixture, v json.RawMessage) (string, error) {
			if string(v) == "null" {
				return "zone null", nil
			}
			s, err := jsonString("zone", v)
			return fmt.Sprintf("zone %q", s), err
		}),
		fieldRow("resources", "vcpu, memory_mib, disk_gib, size_class of the class asked for (s)", func(_ *objectFixture, v json.RawMessage) (string, error) {
			m, err := jsonObject("resources", v)
			if err != nil {
				return "", err
			}
			var r client.Resources
			if err := json.Unmarshal(v, &r); err != nil {
				return "", fmt.Errorf("resources %s: %w", v, err)
			}
			saw := fmt.Sprintf("resources %s", v)
			for _, k := range []string{"vcpu", "memory_mib", "disk_gib", "size_class"} {
				if _, ok := m[k]; !ok {
					return saw, fmt.Errorf("resources has no %s", k)
				}
			}
			if r.SizeClass != "s" || r.VCPU < 1 || r.MemoryMiB < 1 || r.DiskGiB < 1 {
				return saw, fmt.Errorf("want size_class s with positive vcpu, memory_mib, disk_gib")
			}
			return saw, nil
		}),
		fieldRow("volume_id", "null when none was given", nullField("volume_id")),
		fieldRow("policy_id", "null when none was given", nullField("policy_id")),
		fieldRow("idle_timeout_s", "the value given (600)", numberIs("idle_timeout_s", 600)),
		fieldRow("max_lifetime_s", "the value given (1800)", numberIs("max_lifetime_s", 1800)),
		fieldRow("started_at", "null until running, then set", func(f *objectFixture, v json.RawMessage) (string, error) {
			t, err := jsonTime("started_at", v)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("started_at %s, %s after the create", t.Format(time.RFC3339Nano), t.Sub(f.created.CreatedAt.Time).Round(time.Millisecond))
			switch {
			case f.created.StartedAt != nil:
				return saw, fmt.Errorf("the create's answer (pending) had started_at set")
			case f.startedLeak != "":
				return saw, fmt.Errorf("started_at was set while %s", f.startedLeak)
			}
			return saw, nil
		}),
		fieldRow("expires_at", "started_at + max_lifetime_s", func(f *objectFixture, v json.RawMessage) (string, error) {
			t, err := jsonTime("expires_at", v)
			if err != nil {
				return "", err
			}
			want := f.running.StartedAt.Add(time.Duration(f.running.MaxLifetimeS) * time.Second)
			saw := fmt.Sprintf("expires_at − started_at = %s", t.Sub(f.running.StartedAt.Time))
			if !t.Equal(want) {
				err = fmt.Errorf("want %s", want.Format(time.RFC3339Nano))
			}
			return saw, err
		}),
		fieldRow("last_activity_at", "a time (or null before any activity)", func(_ *objectFixture, v json.RawMessage) (string, error) {
			if string(v) == "null" {
				return "last_activity_at null", nil
			}
			t, err := jsonTime("last_activity_at", v)
			return "last_activity_at " + t.Format(time.RFC3339Nano), err
		}),
		fieldRow("cold_start", "a boolean once running", func(_ *objectFixture, v json.RawMessage) (string, error) {
			var b bool
			if err := json.Unmarshal(v, &b); err != nil || string(v) == "null" {
				return "", fmt.Errorf("cold_start is %s, want true or false", v)
			}
			return fmt.Sprintf("cold_start %v", b), nil
		}),
		fieldRow("connect", "exec_url http(s)://…/v1/sessions/{id}/exec, pty_url ws(s)://…/v1/sessions/{id}/pty", func(f *objectFixture, v json.RawMessage) (string, error) {
			var c struct {
				ExecURL *string `json:"exec_url"`
				PTYURL  *string `json:"pty_url"`
			}
			if err := json.Unmarshal(v, &c); err != nil || c.ExecURL == nil || c.PTYURL == nil {
				return "", fmt.Errorf("connect is %s, want exec_url and pty_url", v)
			}
			id := f.running.ID
			// Only scheme, host and path are shown: the query may carry a connect token.
			check := func(field, raw string, schemes []string, suffix string) (string, error) {
				u, err := url.Parse(raw)
				if err != nil {
					return "", fmt.Errorf("%s is not a URL: %w", field, err)
				}
				shown := u.Scheme + "://" + u.Host + u.Path
				if !slices.Contains(schemes, u.Scheme) || u.Host == "" || !strings.HasSuffix(u.Path, suffix) {
					return shown, fmt.Errorf("%s %s: want %s://…%s", field, shown, strings.Join(schemes, "|"), suffix)
				}
				return shown, nil
			}
			e, err1 := check("exec_url", *c.ExecURL, []string{"http", "https"}, "/v1/sessions/"+id+"/exec")
			p, err2 := check("pty_url", *c.PTYURL, []string{"ws", "wss"}, "/v1/sessions/"+id+"/pty")
			return "exec_url " + e + ", pty_url " + p, errors.Join(err1, err2)
		}),
		fieldRow("usage_to_date", "session_s, cpu_ms, mem_gib_ms, egress_bytes (integers ≥ 0)", func(_ *objectFixture, v json.RawMessage) (string, error) {
			m, err := jsonObject("usage_to_date", v)
			if err != nil {
				return "", err
			}
			for _, k := range []string{"session_s", "cpu_ms", "mem_gib_ms", "egress_bytes"} {
				n, err := jsonNumber("usage_to_date."+k, m[k])
				if err != nil {
					return string(v), err
				}
				if n < 0 {
					return string(v), fmt.Errorf("usage_to_date.%s is %d", k, n)
				}
			}
			return "usage_to_date " + string(v), nil
		}),
		fieldRow("created_at", "(API.md) RFC 3339 with milliseconds, at the create", func(f *objectFixture, v json.RawMessage) (string, error) {
			t, err := jsonTime("created_at", v)
			if err != nil {
				return "", err
			}
			if f.running.StartedAt != nil && t.After(f.running.StartedAt.Time) {
				return "", fmt.Errorf("created_at %s after started_at %s", t, f.running.StartedAt)
			}
			return "created_at " + t.Format(time.RFC3339Nano), nil
		}),
		fieldRow("state_reason", "(API.md) with paused_at, stopped_at, idle_warning_at, lifetime_warning_at: null while running", func(f *objectFixture, _ json.RawMessage) (string, error) {
			var present []string
			for _, k := range []string{"state_reason", "paused_at", "stopped_at", "idle_warning_at", "lifetime_warning_at"} {
				v, ok := f.raw[k]
				if ok && string(v) != "null" {
					return "", fmt.Errorf("%s is %s while running, want null", k, v)
				}
				if ok {
					present = append(present, k)
				}
			}
			if !slices.Contains(present, "state_reason") || !slices.Contains(present, "stopped_at") {
				return "", fmt.Errorf("the running session lacks state_reason or stopped_at (has %v)", present)
			}
			return "null: " + strings.Join(present, ", "), nil
		}),
	}
}

func nullField(field string) func(*objectFixture, json.RawMessage) (string, error) {
	return func(_ *objectFixture, v json.RawMessage) (string, error) {
		if string(v) != "null" {
			return "", fmt.Errorf("%s is %s, want null", field, v)
		}
		return field + " null", nil
	}
}

func numberIs(field string, want int64) func(*objectFixture, json.RawMessage) (string, error) {
	return func(_ *objectFixture, v json.RawMessage) (string, error) {
		n, err := jsonNumber(field, v)
		if err == nil && n != want {
			err = fmt.Errorf("%s %d, want %d", field, n, want)
		}
		return fmt.Sprintf("%s %d", field, n), err
	}
}
