package node

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"wb/quota"
	"wb/session"
)

// pending is a change the node made that Redis has not recorded yet: a transition, a warning
// or a usage figure. The node applies them in order once Redis answers.
type pending struct {
	Kind   string         `json:"kind"` // "transition" | "warning" | "rearm" | "usage"
	From   session.State  `json:"from,omitempty"`
	To     session.State  `json:"to,omitempty"`
	Driver session.Driver `json:"driver,omitempty"`
	Reason session.Reason `json:"reason,omitempty"`
	Rule   string         `json:"rule,omitempty"`
	Event  string         `json:"event,omitempty"`
	At     time.Time      `json:"at"`
	Cold   *bool          `json:"cold,omitempty"`
	Usage  *quota.Record  `json:"usage,omitempty"`
}

// guest is the node's record of one session's guest. It is written to disk on every change,
// so that a restarted node keeps enforcing the session's timers and replays what Redis missed.
type guest struct {
	SessionID string            `json:"session_id"`
	Project   string            `json:"project_id"`
	EndUserID string            `json:"end_user_id,omitempty"`
	PolicyID  string            `json:"policy_id,omitempty"`
	Seq       int64             `json:"seq"` // of the last usage record
	GuestID   string            `json:"guest_id"`
	Tier      int               `json:"tier"`
	Template  string            `json:"template"`
	Resources session.Resources `json:"resources"`
	State     session.State     `json:"state"`
	Reason    session.Reason    `json:"reason,omitempty"`
	Rule      string            `json:"rule,omitempty"`

	IdleTimeoutS int       `json:"idle_timeout_s"`
	MaxLifetimeS int       `json:"max_lifetime_s"`
	StartedAt    time.Time `json:"started_at"`
	LastActivity time.Time `json:"last_activity"`
	// ActivityUntil: the journal counts the guest active until then (see touch), which a
	// restart takes as its last activity when later than LastActivity.
	ActivityUntil time.Time `json:"activity_until,omitzero"`
	PausedAt      time.Time `json:"paused_at"`
	IdleWarned    bool      `json:"idle_warned"`
	LifeWarned    bool      `json:"life_warned"`
	Cold          bool      `json:"cold"`

	// Usage so far, and when it was last sampled.
	BilledMs    int64 `json:"billed_ms"`
	CPUMs       int64 `json:"cpu_ms"`
	MemGiBMs    int64 `json:"mem_gib_ms"`
	EgressBytes int64 `json:"egress_bytes"`
	CPURaw      int64 `json:"cpu_raw"` // the cgroup's counter at the last sample
	// CPUBaseline: CPURaw is a reading of the guest's counter (a sample's, or the baseline
	// Provision takes), which may well be 0; without one the next sample bills the counter
	// whole.
	CPUBaseline bool      `json:"cpu_baseline,omitempty"`
	SampledAt   time.Time `json:"sampled_at"`
	// UncountedMs is the time sampled since the last sample with the counters, whose memory
	// the next such sample bills (its reading stands for the whole span).
	UncountedMs int64 `json:"uncounted_ms,omitempty"`

	Pending []pending `json:"pending,omitempty"`
}

// idleDeadline is when the idle timer fires.
func (g *guest) idleDeadline() time.Time {
	from := g.StartedAt
	if g.LastActivity.After(from) {
		from = g.LastActivity
	}
	return from.Add(time.Duration(g.IdleTimeoutS) * time.Second)
}

func (g *guest) idleWarning() time.Time {
	return g.idleDeadline().Add(-time.Duration(g.IdleTimeoutS) * time.Second * (100 - session.IdleWarningPercent) / 100)
}

// timerDue reports whether one of the guest's timers (a warning, the idle deadline, the
// lifetime, a pause's end) is due at now.
func (g *guest) timerDue(now time.Time) bool {
	switch g.State {
	case session.Running:
		return !now.Before(g.expiry()) || !now.Before(g.idleDeadline()) ||
			(!g.LifeWarned && !now.Before(g.lifetimeWarning())) || (!g.IdleWarned && !now.Before(g.idleWarning()))
	case session.Paused:
		return !now.Before(g.expiry()) || !now.Before(g.PausedAt.Add(session.PauseMax))
	}
	return false
}

func (g *guest) expiry() time.Time {
	return g.StartedAt.Add(time.Duration(g.MaxLifetimeS) * time.Second)
}

func (g *guest) lifetimeWarning() time.Time {
	return g.StartedAt.Add(time.Duration(g.MaxLifetimeS) * time.Second * session.LifetimeWarningPercent / 100)
}

// journal keeps one JSON file per guest under dir.
type journal struct {
	dir string
	// write replaces the file at path with b; nil: writeReplacing (tests slow it down).
	write func(path string, b []byte) error
}

func (j journal) path(id string) string { return filepath.Join(j.dir, id+".json") }

// put replaces guest id's entry with b.
func (j journal) put(id string, b []byte) error {
	write := j.write
	if write == nil {
		write = writeReplacing
	}
	if err := write(j.path(id), b); err != nil {
		return fmt.Errorf("journal %s: %w", id, err)
	}
	return nil
}

// writeReplacing writes b to a temporary file and renames it over path, so that a crash
// leaves the old entry or the new one, never part of one.
func writeReplacing(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (j journal) remove(id string) error {
	err := os.Remove(j.path(id))
	if os.IsNotExist(err) {
		return nil
	}
	return err
}

func (j journal) load() ([]*guest, error) {
	entries, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	var out []*guest
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(j.dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("journal: %w", err)
		}
		var g guest
		if err := json.Unmarshal(b, &g); err != nil {
			return nil, fmt.Errorf("journal %s: %w", e.Name(), err)
		}
		out = append(out, &g)
	}
	return out, nil
}
