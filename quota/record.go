package quota

import (
	"fmt"
	"strconv"

	"wb/session"
)

// Record is one interval of one session's usage, measured on its node. Seq increases by one
// per record of a session, which is what makes settling idempotent.
type Record struct {
	SessionID   string
	ProjectID   string
	EndUserID   string
	Tier        int
	SizeClass   string
	MemoryMiB   int
	DiskGiB     int
	Seq         int64
	FromMs      int64
	ToMs        int64
	State       session.State // the state the interval was spent in
	SessionMs   int64         // billed as session seconds (running, snapshotting, stopping)
	PausedMs    int64         // billed as paused GiB
	CPUMs       int64
	MemGiBMs    int64
	EgressBytes int64
}

// ID names the record: session and sequence.
func (r Record) ID() string { return r.SessionID + ":" + strconv.FormatInt(r.Seq, 10) }

// Values is the record as stream fields.
func (r Record) Values() []any {
	return []any{"session", r.SessionID, "project", r.ProjectID, "eu", r.EndUserID, "tier", r.Tier,
		"size", r.SizeClass, "mem_mib", r.MemoryMiB, "disk_gib", r.DiskGiB, "seq", r.Seq,
		"from", r.FromMs, "to", r.ToMs, "state", string(r.State), "session_ms", r.SessionMs,
		"paused_ms", r.PausedMs, "cpu_ms", r.CPUMs, "mem_gib_ms", r.MemGiBMs, "egress", r.EgressBytes}
}

// DecodeRecord parses stream fields.
func DecodeRecord(v map[string]any) (Record, error) {
	s := func(k string) string { x, _ := v[k].(string); return x }
	n := func(k string) int64 { x, _ := strconv.ParseInt(s(k), 10, 64); return x }
	r := Record{SessionID: s("session"), ProjectID: s("project"), EndUserID: s("eu"), Tier: int(n("tier")),
		SizeClass: s("size"), MemoryMiB: int(n("mem_mib")), DiskGiB: int(n("disk_gib")), Seq: n("seq"),
		FromMs: n("from"), ToMs: n("to"), State: session.State(s("state")), SessionMs: n("session_ms"),
		PausedMs: n("paused_ms"), CPUMs: n("cpu_ms"), MemGiBMs: n("mem_gib_ms"), EgressBytes: n("egress")}
	if r.SessionID == "" || r.ProjectID == "" || r.Seq <= 0 {
		return r, fmt.Errorf("usage record: missing session, project or seq: %v", v)
	}
	if r.SessionMs < 0 || r.PausedMs < 0 || r.CPUMs < 0 || r.MemGiBMs < 0 || r.EgressBytes < 0 {
		return r, fmt.Errorf("usage record %s: negative usage", r.ID())
	}
	return r, nil
}
