package session

import (
	"fmt"
	"strings"
	"time"
)

// CreateRequest is the body of POST /v1/sessions. Pointers tell "absent" from zero.
type CreateRequest struct {
	Tier         *int              `json:"tier"`
	Template     string            `json:"template,omitempty"`
	Region       string            `json:"region,omitempty"`
	Resources    *ResourceRequest  `json:"resources,omitempty"`
	IdleTimeoutS *int              `json:"idle_timeout_s,omitempty"`
	MaxLifetimeS *int              `json:"max_lifetime_s,omitempty"`
	EndUserID    string            `json:"end_user_id,omitempty"`
	PolicyID     string            `json:"policy_id,omitempty"`
	VolumeID     string            `json:"volume_id,omitempty"`
	RestoreFrom  string            `json:"restore_from,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
}

// Limits on free-form fields.
const (
	MaxIDLen          = 128
	MaxMetadataKeys   = 50
	MaxMetadataKeyLen = 40
	MaxMetadataValLen = 500
)

// ReservedMetadataPrefix starts the metadata keys that belong to the platform; a request (or an
// admission patch) may not set them.
const ReservedMetadataPrefix = "wb."

// DesktopMetadataKey marks the sessions a desktop runs as (one per start or wake): its value is
// the desktop's id. The platform sets it after admission, so no caller can claim a session
// for a desktop and admission decides on the request as the caller would have sent it.
const DesktopMetadataKey = ReservedMetadataPrefix + "desktop_id"

// RunMetadataKey marks the session of an ephemeral tier-1 run (POST /v1/runs): its value is
// the run's runtime, so that the node hands it a warm guest whose interpreter already waits
// for the code. The platform sets it after admission, as DesktopMetadataKey.
const RunMetadataKey = ReservedMetadataPrefix + "run_runtime"

// ReservedMetadataKey reports whether k belongs to the platform.
func ReservedMetadataKey(k string) bool { return strings.HasPrefix(k, ReservedMetadataPrefix) }

// Settings are the validated, defaulted values of a create request.
type Settings struct {
	Tier         Tier
	Resources    Resources
	IdleTimeoutS int
	MaxLifetimeS int
}

// Validate checks every range in the request against tiers and fills the defaults. Template
// and region are checked by the caller, which knows the catalog.
func (r *CreateRequest) Validate(tiers Tiers) (Settings, error) {
	if r.Tier == nil {
		return Settings{}, &FieldError{Field: "tier", Message: "is required (1–4)"}
	}
	t, err := tiers.Tier(*r.Tier)
	if err != nil {
		return Settings{}, err
	}
	idle, life := IdleTimeoutDefaultS, min(LifetimeDefaultS, t.MaxLifetimeS)
	if r.IdleTimeoutS != nil {
		idle = *r.IdleTimeoutS
	}
	if r.MaxLifetimeS != nil {
		life = *r.MaxLifetimeS
	}
	if err := t.ValidateTimeouts(idle, life); err != nil {
		return Settings{}, err
	}
	res, err := t.Resolve(r.Resources)
	if err != nil {
		return Settings{}, err
	}
	for _, f := range []struct{ name, v string }{
		{"end_user_id", r.EndUserID}, {"policy_id", r.PolicyID}, {"volume_id", r.VolumeID},
		{"restore_from", r.RestoreFrom}, {"template", r.Template}, {"region", r.Region},
	} {
		if len(f.v) > MaxIDLen {
			return Settings{}, &FieldError{Field: f.name, Message: fmt.Sprintf("at most %d characters", MaxIDLen)}
		}
	}
	if len(r.Metadata) > MaxMetadataKeys {
		return Settings{}, &FieldError{Field: "metadata", Message: fmt.Sprintf("at most %d keys", MaxMetadataKeys)}
	}
	for k, v := range r.Metadata {
		if k == "" || len(k) > MaxMetadataKeyLen {
			return Settings{}, &FieldError{Field: "metadata", Message: fmt.Sprintf("keys must be 1–%d characters", MaxMetadataKeyLen)}
		}
		if ReservedMetadataKey(k) {
			return Settings{}, &FieldError{Field: "metadata." + k, Message: fmt.Sprintf("is reserved: the %s prefix belongs to the platform; use another key", ReservedMetadataPrefix)}
		}
		if len(v) > MaxMetadataValLen {
			return Settings{}, &FieldError{Field: "metadata." + k, Message: fmt.Sprintf("at most %d characters", MaxMetadataValLen)}
		}
	}
	return Settings{Tier: t, Resources: res, IdleTimeoutS: idle, MaxLifetimeS: life}, nil
}

// PatchRequest is the body of PATCH /v1/sessions/{id}.
type PatchRequest struct {
	IdleTimeoutS *int `json:"idle_timeout_s,omitempty"`
	MaxLifetimeS *int `json:"max_lifetime_s,omitempty"`
}

// ApplyPatch returns s with the new timers, validated against the tier; a new lifetime counts
// from started_at and must end after now.
func ApplyPatch(tiers Tiers, s Session, p PatchRequest, now time.Time) (Session, error) {
	if p.IdleTimeoutS == nil && p.MaxLifetimeS == nil {
		return s, &FieldError{Field: "body", Message: "give idle_timeout_s or max_lifetime_s"}
	}
	t, err := tiers.Tier(s.Tier)
	if err != nil {
		return s, err
	}
	if p.IdleTimeoutS != nil {
		s.IdleTimeoutS = *p.IdleTimeoutS
	}
	if p.MaxLifetimeS != nil {
		s.MaxLifetimeS = *p.MaxLifetimeS
	}
	if err := t.ValidateTimeouts(s.IdleTimeoutS, s.MaxLifetimeS); err != nil {
		return s, err
	}
	if p.MaxLifetimeS != nil && s.StartedAt != nil {
		exp := s.Expiry()
		if !exp.After(now) {
			return s, &FieldError{Field: "max_lifetime_s", Message: fmt.Sprintf(
				"counts from started_at (%s); %d s ends at %s, already past", s.StartedAt.Format(TimeLayout), s.MaxLifetimeS, exp.Format(TimeLayout))}
		}
		s.ExpiresAt = exp
	}
	return s, nil
}
