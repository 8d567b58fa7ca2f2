package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// ErrNotFound: no such session in this project.
var ErrNotFound = errors.New("not found")

// ErrExists: a session with this id already exists.
var ErrExists = errors.New("session id already exists")

// ErrLapsed: a Commit came after its reservation lapsed (ReservationLapse), and wrote nothing.
var ErrLapsed = errors.New("the create's slot lapsed before it was written")

// ConflictError: the session is not in the state (or at the version) the caller expected.
type ConflictError struct {
	Current session.State
	Version int64
	Message string
	// Snapshot, with Current snapshotting, is the snapshot the session takes when a change
	// named another (Change.Snapshot).
	Snapshot string
}

func (e *ConflictError) Error() string {
	if e.Message != "" {
		return e.Message
	}
	return fmt.Sprintf("session is %s (version %d)", e.Current, e.Version)
}

// ConcurrencyError: the project has no free concurrency slot.
type ConcurrencyError struct{ Limit, Used int }

func (e *ConcurrencyError) Error() string {
	return fmt.Sprintf("concurrency limit reached: %d of %d sessions active", e.Used, e.Limit)
}

// Store is the Redis session store. Safe for concurrent use.
type Store struct {
	rdb redis.UniversalClient
	// Retention is how long a terminal session stays readable.
	retention time.Duration
	now       func() time.Time
	// tiers give each new session its provisioning deadline (provisionDeadline).
	tiers session.Tiers
	// idemLease is how long an Idempotency-Key's claim outlives its last renewal.
	idemLease time.Duration
	// changes announces the writes of what gateways cache (changes.go).
	changes *Changes
	// oneRedis: not a Cluster, so the create and transition scripts may write the global
	// signals and indexes too (indexes.go).
	oneRedis bool
	// admits runs admitScript: concurrent creates share round trips (trips.go).
	admits *sharedTrips
	// desktopLeases and snapshotLeases are the lease sets of desktops' transitions and
	// sessions' snapshots, written where writeDesktopAndSnapshotLeasesInShards says (tests
	// of the next release's binary write them in the shards).
	desktopLeases, snapshotLeases shardedLeases
}

// Option configures a Store.
type Option func(*Store)

// WithRetention sets how long terminal sessions stay readable (default 7 days).
func WithRetention(d time.Duration) Option { return func(s *Store) { s.retention = d } }

// WithClock replaces time.Now (tests).
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithTiers sets the tiers whose provisioning deadlines Create records (default
// session.DefaultTiers); give the placer the same.
func WithTiers(t session.Tiers) Option { return func(s *Store) { s.tiers = t } }

// WithIdemLease sets how long a request's claim on an Idempotency-Key outlives its last
// renewal (default DefaultIdemLease; tests shorten it).
func WithIdemLease(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.idemLease = d
		}
	}
}

// New returns a Store over any go-redis client: a single server, a Cluster or a Ring.
func New(rdb redis.UniversalClient, opts ...Option) *Store {
	s := &Store{rdb: rdb, retention: 7 * 24 * time.Hour, now: time.Now, tiers: session.DefaultTiers(), idemLease: DefaultIdemLease,
		desktopLeases:  desktopLeaseSet(writeDesktopAndSnapshotLeasesInShards),
		snapshotLeases: snapshotLeaseSet(writeDesktopAndSnapshotLeasesInShards)}
	for _, o := range opts {
		o(s)
	}
	s.changes = NewChanges(rdb, nil)
	_, cluster := rdb.(*redis.ClusterClient)
	s.oneRedis = !cluster
	s.admits = newSharedTrips(rdb, admitScript)
	return s
}

// static is the part of a session that is fixed at creation, kept as one JSON field.
type static struct {
	ID          string            `json:"id"`
	Tier        int               `json:"tier"`
	ProjectID   string            `json:"project_id"`
	EndUserID   *string           `json:"end_user_id,omitempty"`
	Template    string            `json:"template"`
	Region      string            `json:"region"`
	Resources   session.Resources `json:"resources"`
	VolumeID    *string           `json:"volume_id,omitempty"`
	PolicyID    *string           `json:"policy_id,omitempty"`
	RestoreFrom *string           `json:"restore_from,omitempty"`
	Connect     session.Connect   `json:"connect"`
	Metadata    map[string]string `json:"metadata,omitempty"`
}

// appendJSON appends d as json.Marshal encodes it, byte for byte, without its reflection
// (TestStaticAppendJSON holds the two equal): every create writes one.
func (d *static) appendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = session.AppendJSONString(b, d.ID)
	b = append(b, `,"tier":`...)
	b = strconv.AppendInt(b, int64(d.Tier), 10)
	b = append(b, `,"project_id":`...)
	b = session.AppendJSONString(b, d.ProjectID)
	if d.EndUserID != nil {
		b = append(b, `,"end_user_id":`...)
		b = session.AppendJSONString(b, *d.EndUserID)
	}
	b = append(b, `,"template":`...)
	b = session.AppendJSONString(b, d.Template)
	b = append(b, `,"region":`...)
	b = session.AppendJSONString(b, d.Region)
	b = append(b, `,"resources":`...)
	b = d.Resources.AppendJSON(b)
	for _, f := range [...]struct {
		name string
		v    *string
	}{{`,"volume_id":`, d.VolumeID}, {`,"policy_id":`, d.PolicyID}, {`,"restore_from":`, d.RestoreFrom}} {
		if f.v != nil {
			b = append(b, f.name...)
			b = session.AppendJSONString(b, *f.v)
		}
	}
	b = append(b, `,"connect":`...)
	b = d.Connect.AppendJSON(b)
	if len(d.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = session.AppendJSONStringMap(b, d.Metadata)
	}
	return append(b, '}')
}

// Create reserves one of the project's limit concurrency slots and writes sess in pending,
// with its session.pending event, atomically. sess.State must be pending and sess.ID,
// ProjectID and CreatedAt set.
func (s *Store) Create(ctx context.Context, sess *session.Session, limit int) (*session.Session, error) {
	out, err := s.Admit(ctx, sess, Admission{Concurrency: limit})
	return out.Session, err
}

func eventFields(id, project string, from, to session.State, d session.Driver, reason session.Reason, rule string, atMs int64) []any {
	return appendEventFields(make([]any, 0, 2*eventFieldCount), id, project, from, to, d, reason, rule, atMs)
}

// eventFieldCount is how many fields (each a name and a value) appendEventFields appends.
const eventFieldCount = 11

// appendEventFields appends eventFields' fields to args.
func appendEventFields(args []any, id, project string, from, to session.State, d session.Driver, reason session.Reason, rule string, atMs int64) []any {
	return append(args,
		"id", session.NewID("evt_", time.UnixMilli(atMs)),
		"type", session.EventType(from, to),
		"session_id", id, "project_id", project,
		"from", string(from), "to", string(to), "driver", string(d),
		"reason", string(reason), "rule", rule, "at", atMs,
	)
}

// Get returns the session, or ErrNotFound if the project has no such session.
func (s *Store) Get(ctx context.Context, project, id string) (*session.Session, error) {
	m, err := s.rdb.HGetAll(ctx, ProjectKeys(project).session(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("get session %s: %w", id, err)
	}
	if len(m) == 0 {
		return nil, ErrNotFound
	}
	return decode(m)
}

// Change is one transition request.
type Change struct {
	Project, ID string
	From, To    session.State
	Driver      session.Driver
	Reason      session.Reason
	Rule        string // the policy rule, with PolicyViolation
	// Version, when not 0, must equal the session's version.
	Version int64
	// Set on the session in the same step: the placement (pending → provisioning) and
	// whether the start was cold (provisioning → running). Empty or nil leaves them.
	Zone, NodeID string
	ColdStart    *bool
	// At, when set, is when the transition happened: a node replaying transitions it made
	// while Redis was unreachable passes the time it made them. Zero means now.
	At time.Time
	// Snapshot names the snapshot of a transition to or from snapshotting: one to it records
	// it as the snapshot the session takes; one from it applies only while the session takes
	// that one (so a gateway's late close of an older snapshot cannot end a newer one).
	// Empty: none recorded, or any.
	Snapshot string
}

// Transition makes one transition atomically, if the contract allows it and the session is
// in c.From (and at c.Version). It returns the session after the change.
func (s *Store) Transition(ctx context.Context, c Change) (*session.Session, error) {
	if err := session.Check(c.From, c.To, c.Driver, c.Reason); err != nil {
		return nil, err
	}
	if c.From == "" {
		return nil, &session.FieldError{Field: "from", Message: "use Create for → pending"}
	}
	now := s.now().UnixMilli()
	if !c.At.IsZero() {
		now = c.At.UnixMilli()
	}
	var extra []any
	if c.Zone != "" {
		extra = append(extra, "zone", c.Zone)
	}
	if c.NodeID != "" {
		extra = append(extra, "node", c.NodeID)
	}
	if c.ColdStart != nil {
		extra = append(extra, "cold", strconv.FormatBool(*c.ColdStart))
	}
	if c.To == session.Snapshotting && c.Snapshot != "" {
		extra = append(extra, "snap", c.Snapshot)
	}
	expectSnapshot := ""
	if c.From == session.Snapshotting {
		expectSnapshot = c.Snapshot
	}
	terminal := "0"
	if c.To.Terminal() {
		terminal = "1"
	}
	ref := SessionRef{Project: c.Project, ID: c.ID}
	args := []any{c.ID, string(c.From), string(c.To), c.Version, string(c.Reason), c.Rule, now,
		terminal, int64(s.retention / time.Second), c.Project, ref.member(), expectSnapshot, len(extra)}
	args = append(args, extra...)
	args = append(args, eventFields(c.ID, c.Project, c.From, c.To, c.Driver, c.Reason, c.Rule, now)...)
	k := ProjectKeys(c.Project)
	keys := []string{k.session(c.ID), k.byState(c.From), k.byState(c.To), k.active(), Outbox(c.Project), k.retained()}
	if s.oneRedis { // the script keeps the global indexes too (transitionScript)
		keys = append(keys, signalKey(WorkOutbox), provisionDeadlinesKey)
		if c.NodeID != "" {
			keys = append(keys, nodeSessionsKey(c.NodeID))
		}
	}
	res, err := transitionScript.Run(ctx, s.rdb, keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("transition %s %s→%s: %w", c.ID, c.From, c.To, err)
	}
	switch res[0] {
	case "NOTFOUND":
		return nil, ErrNotFound
	case "CONFLICT":
		v, _ := strconv.ParseInt(res[2], 10, 64)
		return nil, &ConflictError{Current: session.State(res[1]), Version: v}
	case "REASON":
		return nil, &ConflictError{Current: session.Stopping, Message: fmt.Sprintf(
			"session is stopping for %s; it must end with that reason, not %q", res[1], c.Reason)}
	case "SNAPSHOT":
		v, _ := strconv.ParseInt(res[2], 10, 64)
		return nil, &ConflictError{Current: session.Snapshotting, Version: v, Snapshot: res[1], Message: fmt.Sprintf(
			"session is taking snapshot %s, not %s", res[1], c.Snapshot)}
	}
	m := make(map[string]string, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		m[res[i]] = res[i+1]
	}
	out, err := decode(m)
	s.afterTransition(ctx, c, out, s.oneRedis)
	return out, err
}

// ActiveCount is the number of concurrency slots the project holds.
func (s *Store) ActiveCount(ctx context.Context, project string) (int64, error) {
	return s.rdb.SCard(ctx, ProjectKeys(project).active()).Result()
}

// PinnedPolicies answers the policy ids (pol_NAME@N) that the project's live sessions (those
// holding a concurrency slot) pinned with policy_id, each once: policies.Engine keeps those
// versions when it trims old ones.
func (s *Store) PinnedPolicies(ctx context.Context, project string) ([]string, error) {
	pins, err := s.PolicyPins(ctx, project)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(pins))
	for id := range pins {
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

// PolicyPins answers, for each policy id (pol_NAME@N) that the project's live sessions
// (those holding a concurrency slot) pinned with policy_id, those sessions' ids, sorted.
func (s *Store) PolicyPins(ctx context.Context, project string) (map[string][]string, error) {
	k := ProjectKeys(project)
	ids, err := s.rdb.SMembers(ctx, k.active()).Result()
	if err != nil {
		return nil, fmt.Errorf("pinned policies of %s: %w", project, err)
	}
	cmds := make([]*redis.StringCmd, len(ids))
	if len(ids) > 0 {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HGet(ctx, k.session(id), "doc")
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("pinned policies of %s: %w", project, err)
		}
	}
	out := map[string][]string{}
	for i, c := range cmds {
		doc, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue // a slot reserved for a create not written yet, or a session just ended
		}
		if err != nil {
			return nil, fmt.Errorf("pinned policies of %s: %w", project, err)
		}
		var st static
		if err := json.Unmarshal([]byte(doc), &st); err != nil {
			return nil, fmt.Errorf("pinned policies of %s: %w", project, err)
		}
		if st.PolicyID != nil {
			out[*st.PolicyID] = append(out[*st.PolicyID], ids[i])
		}
	}
	for _, sessions := range out {
		slices.Sort(sessions)
	}
	return out, nil
}

// decode builds a session from its hash.
func decode(m map[string]string) (*session.Session, error) {
	var st static
	if err := json.Unmarshal([]byte(m["doc"]), &st); err != nil {
		return nil, fmt.Errorf("decode session: %w", err)
	}
	state, err := session.ParseState("state", m["state"])
	if err != nil {
		return nil, fmt.Errorf("decode session %s: %w", st.ID, err)
	}
	num := func(k string) int64 { v, _ := strconv.ParseInt(m[k], 10, 64); return v }
	str := func(k string) *string {
		if v := m[k]; v != "" {
			return &v
		}
		return nil
	}
	s := &session.Session{
		ID: st.ID, Object: session.ObjectName, Tier: st.Tier, State: state, ProjectID: st.ProjectID,
		EndUserID: st.EndUserID, Template: st.Template, Region: st.Region, Zone: str("zone"),
		Resources: st.Resources, VolumeID: st.VolumeID, PolicyID: st.PolicyID,
		IdleTimeoutS: int(num("idle_s")), MaxLifetimeS: int(num("life_s")),
		StartedAt: session.AtMillis(num("started")), ExpiresAt: session.AtMillis(num("expires")),
		LastActivityAt: session.AtMillis(num("activity")), Connect: st.Connect,
		UsageToDate:       session.Usage{SessionS: num("u_ms") / 1000, CPUMs: num("u_cpu"), MemGiBMs: num("u_mem"), EgressBytes: num("u_egress")},
		Rule:              str("rule"),
		IdleWarningAt:     session.AtMillis(num("idle_warn")),
		LifetimeWarningAt: session.AtMillis(num("life_warn")),
		PausedAt:          session.AtMillis(num("paused")),
		StoppedAt:         session.AtMillis(num("stopped")),
		RestoreFrom:       st.RestoreFrom,
		Metadata:          st.Metadata,
		Version:           num("ver"),
		NodeID:            m["node"],
	}
	if c := session.AtMillis(num("created")); c != nil {
		s.CreatedAt = *c
	}
	if r := m["reason"]; r != "" {
		reason := session.Reason(r)
		s.StateReason = &reason
	}
	if c := m["cold"]; c != "" {
		b := c == "true"
		s.ColdStart = &b
	}
	return s, nil
}

// States answers the state of each session of refs in one pipelined round trip; a session
// that is gone answers "".
func (s *Store) States(ctx context.Context, refs []SessionRef) ([]session.State, error) {
	cmds := make([]*redis.StringCmd, len(refs))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range refs {
			cmds[i] = p.HGet(ctx, ProjectKeys(r.Project).session(r.ID), "state")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("session states: %w", err)
	}
	out := make([]session.State, len(refs))
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("session state %s: %w", refs[i].ID, err)
		}
		out[i] = session.State(v)
	}
	return out, nil
}
