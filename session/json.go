package session

import (
	"encoding/json"
	"slices"
	"strconv"
	"unicode/utf8"
)

// AppendJSON appends the session as json.Marshal encodes it, byte for byte, without
// reflection: a create's answer is this, and json.Marshal's walk of the struct was the largest
// part of the gateway's own CPU a create that it could shed (TestSessionAppendJSON holds the
// two equal, every field set and none).
func (s *Session) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, s.ID)
	b = append(b, `,"object":`...)
	b = appendString(b, s.Object)
	b = append(b, `,"tier":`...)
	b = strconv.AppendInt(b, int64(s.Tier), 10)
	b = append(b, `,"state":`...)
	b = appendString(b, string(s.State))
	b = append(b, `,"project_id":`...)
	b = appendString(b, s.ProjectID)
	b = append(b, `,"end_user_id":`...)
	b = appendOptString(b, s.EndUserID)
	b = append(b, `,"template":`...)
	b = appendString(b, s.Template)
	b = append(b, `,"region":`...)
	b = appendString(b, s.Region)
	b = append(b, `,"zone":`...)
	b = appendOptString(b, s.Zone)
	b = append(b, `,"resources":`...)
	b = s.Resources.AppendJSON(b)
	b = append(b, `,"volume_id":`...)
	b = appendOptString(b, s.VolumeID)
	b = append(b, `,"policy_id":`...)
	b = appendOptString(b, s.PolicyID)
	b = append(b, `,"idle_timeout_s":`...)
	b = strconv.AppendInt(b, int64(s.IdleTimeoutS), 10)
	b = append(b, `,"max_lifetime_s":`...)
	b = strconv.AppendInt(b, int64(s.MaxLifetimeS), 10)
	b = append(b, `,"started_at":`...)
	b = appendOptTime(b, s.StartedAt)
	b = append(b, `,"expires_at":`...)
	b = appendOptTime(b, s.ExpiresAt)
	b = append(b, `,"last_activity_at":`...)
	b = appendOptTime(b, s.LastActivityAt)
	b = append(b, `,"cold_start":`...)
	if s.ColdStart == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendBool(b, *s.ColdStart)
	}
	b = append(b, `,"connect":`...)
	b = s.Connect.AppendJSON(b)
	b = append(b, `,"usage_to_date":{"session_s":`...)
	b = strconv.AppendInt(b, s.UsageToDate.SessionS, 10)
	b = append(b, `,"cpu_ms":`...)
	b = strconv.AppendInt(b, s.UsageToDate.CPUMs, 10)
	b = append(b, `,"mem_gib_ms":`...)
	b = strconv.AppendInt(b, s.UsageToDate.MemGiBMs, 10)
	b = append(b, `,"egress_bytes":`...)
	b = strconv.AppendInt(b, s.UsageToDate.EgressBytes, 10)
	b = append(b, `},"state_reason":`...)
	if s.StateReason == nil {
		b = append(b, "null"...)
	} else {
		b = appendString(b, string(*s.StateReason))
	}
	b = append(b, `,"rule":`...)
	b = appendOptString(b, s.Rule)
	b = append(b, `,"idle_warning_at":`...)
	b = appendOptTime(b, s.IdleWarningAt)
	b = append(b, `,"lifetime_warning_at":`...)
	b = appendOptTime(b, s.LifetimeWarningAt)
	b = append(b, `,"paused_at":`...)
	b = appendOptTime(b, s.PausedAt)
	b = append(b, `,"stopped_at":`...)
	b = appendOptTime(b, s.StoppedAt)
	b = append(b, `,"created_at":`...)
	b = s.CreatedAt.appendJSON(b)
	b = append(b, `,"restore_from":`...)
	b = appendOptString(b, s.RestoreFrom)
	b = append(b, `,"metadata":`...)
	b = AppendJSONStringMap(b, s.Metadata)
	return append(b, '}')
}

// AppendJSON appends c as json.Marshal encodes it.
func (c *Connect) AppendJSON(b []byte) []byte {
	b = append(b, `{"exec_url":`...)
	b = appendString(b, c.ExecURL)
	b = append(b, `,"pty_url":`...)
	b = appendString(b, c.PTYURL)
	return append(b, '}')
}

// AppendJSON appends r as json.Marshal encodes it.
func (r *Resources) AppendJSON(b []byte) []byte {
	b = append(b, `{"vcpu":`...)
	b = strconv.AppendInt(b, int64(r.VCPU), 10)
	b = append(b, `,"memory_mib":`...)
	b = strconv.AppendInt(b, int64(r.MemoryMiB), 10)
	b = append(b, `,"disk_gib":`...)
	b = strconv.AppendInt(b, int64(r.DiskGiB), 10)
	b = append(b, `,"size_class":`...)
	b = appendString(b, r.SizeClass)
	return append(b, '}')
}

// appendJSON is t's MarshalJSON, appended.
func (t Time) appendJSON(b []byte) []byte {
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, TimeLayout)
	return append(b, '"')
}

func appendOptTime(b []byte, t *Time) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	return t.appendJSON(b)
}

func appendOptString(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendString(b, *s)
}

// AppendJSONString appends s as json.Marshal encodes a string (appendString).
func AppendJSONString(b []byte, s string) []byte { return appendString(b, s) }

// appendString appends s quoted as json.Marshal does. Printable ASCII that needs no escape
// (all of an id, a URL without &, a template ref) is copied; anything else is json.Marshal's
// own, whose escapes (HTML's <, > and &, U+2028, invalid UTF-8) are then the same by
// construction.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		esc := c >= utf8.RuneSelf
		if c < 64 {
			esc = escapedBelow64>>c&1 != 0
		} else if c < utf8.RuneSelf {
			esc = escapedBelow128>>(c-64)&1 != 0
		}
		if esc {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// The ASCII bytes that json.Marshal escapes in a string, as bit sets: the control characters,
// '"', '&', '<' and '>' below 64, and '\\' (a test holds each one to json.Marshal's).
const (
	escapedBelow64  uint64 = 1<<0x20 - 1 | 1<<'"' | 1<<'&' | 1<<'<' | 1<<'>'
	escapedBelow128 uint64 = 1 << ('\\' - 64)
)

// AppendJSONStringMap appends m as json.Marshal encodes a map[string]string: null when nil,
// else its entries in the order of their keys.
func AppendJSONStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	var arr [16]string
	keys := arr[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, m[k])
	}
	return append(b, '}')
}
