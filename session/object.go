package session

import (
	"fmt"
	"time"
)

// Time is a timestamp that marshals as RFC 3339 UTC with milliseconds, as the seed's example.
type Time struct{ time.Time }

// TimeLayout is the wire format of every timestamp.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// At wraps t, truncated to the millisecond.
func At(t time.Time) *Time { return &Time{t.UTC().Truncate(time.Millisecond)} }

// AtMillis converts Unix milliseconds; 0 means unset and gives nil.
func AtMillis(ms int64) *Time {
	if ms == 0 {
		return nil
	}
	return &Time{time.UnixMilli(ms).UTC()}
}

func (t Time) MarshalJSON() ([]byte, error) {
	return []byte(`"` + t.UTC().Format(TimeLayout) + `"`), nil
}

func (t *Time) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	v, err := time.Parse(`"`+time.RFC3339Nano+`"`, string(b))
	if err != nil {
		return fmt.Errorf("time: want RFC 3339, got %s", b)
	}
	t.Time = v.UTC()
	return nil
}

// Connect holds the URLs a caller uses to reach the guest.
type Connect struct {
	ExecURL string `json:"exec_url"`
	PTYURL  string `json:"pty_url"`
}

// Usage is the live usage estimate from the node's last flush.
type Usage struct {
	SessionS    int64 `json:"session_s"`
	CPUMs       int64 `json:"cpu_ms"`
	MemGiBMs    int64 `json:"mem_gib_ms"`
	EgressBytes int64 `json:"egress_bytes"`
}

// Session is the session object, the Session schema of gateway/openapi.json. Nullable fields
// are pointers so that they marshal as null, never disappear.
type Session struct {
	ID             string    `json:"id"`
	Object         string    `json:"object"`
	Tier           int       `json:"tier"`
	State          State     `json:"state"`
	ProjectID      string    `json:"project_id"`
	EndUserID      *string   `json:"end_user_id"`
	Template       string    `json:"template"`
	Region         string    `json:"region"`
	Zone           *string   `json:"zone"`
	Resources      Resources `json:"resources"`
	VolumeID       *string   `json:"volume_id"`
	PolicyID       *string   `json:"policy_id"`
	IdleTimeoutS   int       `json:"idle_timeout_s"`
	MaxLifetimeS   int       `json:"max_lifetime_s"`
	StartedAt      *Time     `json:"started_at"`
	ExpiresAt      *Time     `json:"expires_at"`
	LastActivityAt *Time     `json:"last_activity_at"`
	ColdStart      *bool     `json:"cold_start"`
	Connect        Connect   `json:"connect"`
	UsageToDate    Usage     `json:"usage_to_date"`

	// Beyond the seed's example object.
	StateReason       *Reason           `json:"state_reason"`
	Rule              *string           `json:"rule"`
	IdleWarningAt     *Time             `json:"idle_warning_at"`
	LifetimeWarningAt *Time             `json:"lifetime_warning_at"`
	PausedAt          *Time             `json:"paused_at"`
	StoppedAt         *Time             `json:"stopped_at"`
	CreatedAt         Time              `json:"created_at"`
	RestoreFrom       *string           `json:"restore_from"`
	Metadata          map[string]string `json:"metadata"`

	// Internal: the compare-and-set version and the node that runs the guest. Never on the wire.
	Version int64  `json:"-"`
	NodeID  string `json:"-"`
}

// ObjectName is the "object" field of a session.
const ObjectName = "session"

// IdleDeadline is when the idle timer fires, counting from the last activity (or start).
func (s *Session) IdleDeadline() time.Time {
	from := s.StartedAt
	if s.LastActivityAt != nil && (from == nil || s.LastActivityAt.After(from.Time)) {
		from = s.LastActivityAt
	}
	if from == nil {
		return time.Time{}
	}
	return from.Add(time.Duration(s.IdleTimeoutS) * time.Second)
}

// IdleWarning is when the idle warning fires (80 % of the idle timeout).
func (s *Session) IdleWarning() time.Time {
	d := s.IdleDeadline()
	if d.IsZero() {
		return d
	}
	return d.Add(-time.Duration(s.IdleTimeoutS) * time.Second * (100 - IdleWarningPercent) / 100)
}

// LifetimeWarning is when the lifetime warning fires (90 % of max_lifetime_s from started_at).
func (s *Session) LifetimeWarning() time.Time {
	if s.StartedAt == nil {
		return time.Time{}
	}
	return s.StartedAt.Add(time.Duration(s.MaxLifetimeS) * time.Second * LifetimeWarningPercent / 100)
}

// Expiry is started_at + max_lifetime_s: a new lifetime always counts from started_at.
func (s *Session) Expiry() *Time {
	if s.StartedAt == nil {
		return nil
	}
	return At(s.StartedAt.Add(time.Duration(s.MaxLifetimeS) * time.Second))
}
