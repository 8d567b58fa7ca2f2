package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Plan is what the operator grants a project. Only the operator sets it
// (PUT /v1/admin/projects/{id}/plan); a tenant may lower any of it for itself
// (PUT /v1/limits, LowerLimits), never raise it.
type Plan struct {
	// Concurrency is the number of sessions that may be active at once.
	Concurrency int `json:"concurrency"`
	// RatePerSec and Burst bound the project's request rate on admission.
	RatePerSec int `json:"rate_per_sec"`
	Burst      int `json:"burst"`
	// SnapshotCount and SnapshotGiB bound the snapshots the project keeps.
	SnapshotCount int `json:"snapshot_count"`
	SnapshotGiB   int `json:"snapshot_gib"`
	// NodeSharePct is the share (1–100 %) of any one node's vCPUs and memory that the
	// project's sessions may hold together; the placer enforces it.
	NodeSharePct int `json:"node_share_pct"`
}

// SnapshotBytes is SnapshotGiB in bytes.
func (p Plan) SnapshotBytes() int64 { return int64(p.SnapshotGiB) << 30 }

// PlanChange names the plan limits to change; nil fields keep their value.
type PlanChange struct {
	Concurrency   *int `json:"concurrency,omitempty"`
	RatePerSec    *int `json:"rate_per_sec,omitempty"`
	Burst         *int `json:"burst,omitempty"`
	SnapshotCount *int `json:"snapshot_count,omitempty"`
	SnapshotGiB   *int `json:"snapshot_gib,omitempty"`
	NodeSharePct  *int `json:"node_share_pct,omitempty"`
}

// planField describes one plan limit once, for validation, storage and the tenant's lowering.
type planField struct {
	name     string // the JSON name
	hash     string // the field in the project hash; the tenant's own value is "own_" + hash
	min, max int
	def      int
	of       func(*Plan) *int
	change   func(*PlanChange) *int
}

var planFields = []planField{
	{"concurrency", "concurrency", 0, 100000, DefaultConcurrency,
		func(p *Plan) *int { return &p.Concurrency }, func(c *PlanChange) *int { return c.Concurrency }},
	{"rate_per_sec", "rate", 0, 1000000, DefaultRatePerSec,
		func(p *Plan) *int { return &p.RatePerSec }, func(c *PlanChange) *int { return c.RatePerSec }},
	{"burst", "burst", 1, 1000000, DefaultBurst,
		func(p *Plan) *int { return &p.Burst }, func(c *PlanChange) *int { return c.Burst }},
	{"snapshot_count", "snapshot_count", 0, 1000000, DefaultSnapshotCount,
		func(p *Plan) *int { return &p.SnapshotCount }, func(c *PlanChange) *int { return c.SnapshotCount }},
	{"snapshot_gib", "snapshot_gib", 0, 1000000, DefaultSnapshotGiB,
		func(p *Plan) *int { return &p.SnapshotGiB }, func(c *PlanChange) *int { return c.SnapshotGiB }},
	{"node_share_pct", "node_share_pct", 1, 100, DefaultNodeSharePct,
		func(p *Plan) *int { return &p.NodeSharePct }, func(c *PlanChange) *int { return c.NodeSharePct }},
}

// DefaultPlan is the plan of a new project.
func DefaultPlan() Plan {
	var p Plan
	for _, f := range planFields {
		*f.of(&p) = f.def
	}
	return p
}

func (f planField) check(v int) error {
	if v < f.min || v > f.max {
		return &session.FieldError{Field: f.name, Message: fmt.Sprintf("must be %d–%d, got %d", f.min, f.max, v)}
	}
	return nil
}

// planValue is one plan limit a PlanChange sets, and its value.
type planValue struct {
	planField
	v int
}

// values answers the limits c sets, each checked against its field's range.
func (c *PlanChange) values() ([]planValue, error) {
	var out []planValue
	for _, f := range planFields {
		if v := f.change(c); v != nil {
			if err := f.check(*v); err != nil {
				return nil, err
			}
			out = append(out, planValue{f, *v})
		}
	}
	return out, nil
}

func (p Plan) hashArgs() []any {
	args := make([]any, 0, 2*len(planFields))
	for _, f := range planFields {
		args = append(args, f.hash, *f.of(&p))
	}
	return args
}

// planFromHash answers the operator's plan and the limits in force (the plan, lowered by the
// tenant's own values). A field the hash lacks takes its default.
func planFromHash(m map[string]string) (granted, inForce Plan) {
	for _, f := range planFields {
		v, err := strconv.Atoi(m[f.hash])
		if err != nil {
			v = f.def
		}
		*f.of(&granted) = v
		*f.of(&inForce) = v
		if own, err := strconv.Atoi(m["own_"+f.hash]); err == nil && own < v {
			*f.of(&inForce) = own
		}
	}
	return granted, inForce
}

// PlanLimitError: a tenant asked for more than its plan grants.
type PlanLimitError struct {
	Field string // the JSON name of the plan limit
	Asked int
	Plan  int
}

func (e *PlanLimitError) Error() string {
	return fmt.Sprintf("%s: %d is above your plan's %d; a project may only lower its plan limits (the operator raises them)",
		e.Field, e.Asked, e.Plan)
}

// SetPlan changes the operator's plan of project id; fields left nil keep their value, and
// waits until every gateway has dropped its copy of the project (Changes.Publish).
// ErrNotFound if there is no such project.
func (s *Store) SetPlan(ctx context.Context, id string, c PlanChange) error {
	values, err := c.values()
	if err != nil {
		return err
	}
	var args []any
	for _, pv := range values {
		args = append(args, pv.hash, pv.v)
	}
	n, err := s.rdb.Exists(ctx, ProjectKeys(id).project()).Result()
	if err != nil {
		return fmt.Errorf("set plan of %s: %w", id, err)
	}
	if n == 0 {
		return ErrNotFound
	}
	if len(args) == 0 {
		return nil
	}
	if err := s.rdb.HSet(ctx, ProjectKeys(id).project(), args...).Err(); err != nil {
		return fmt.Errorf("set plan of %s: %w", id, err)
	}
	s.changes.Publish(ctx, id, ChangePlan)
	return nil
}

// LowerLimits records the tenant's own values of plan limits. A value above the plan is
// refused with a *PlanLimitError naming the field and changes nothing; a value equal to the
// plan's drops the tenant's own value, so the project follows the plan again. Like SetPlan, it
// waits until every gateway has dropped its copy of the project.
func (s *Store) LowerLimits(ctx context.Context, id string, c PlanChange) error {
	values, err := c.values()
	if err != nil {
		return err
	}
	p, err := s.GetProject(ctx, id) // fresh: the caller's copy may predate the operator's change
	if err != nil {
		return err
	}
	set, drop := []any{}, []string{}
	for _, pv := range values {
		plan := *pv.of(&p.Granted)
		switch {
		case pv.v > plan:
			return &PlanLimitError{Field: pv.name, Asked: pv.v, Plan: plan}
		case pv.v == plan:
			drop = append(drop, "own_"+pv.hash)
		default:
			set = append(set, "own_"+pv.hash, pv.v)
		}
	}
	if len(set) == 0 && len(drop) == 0 {
		return nil
	}
	_, err = s.rdb.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		if len(set) > 0 {
			pl.HSet(ctx, ProjectKeys(p.ID).project(), set...)
		}
		if len(drop) > 0 {
			pl.HDel(ctx, ProjectKeys(p.ID).project(), drop...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lower limits of %s: %w", p.ID, err)
	}
	s.changes.Publish(ctx, p.ID, ChangePlan)
	return nil
}

// SnapshotUsage answers how many snapshots the project keeps (in any state) and their bytes.
func (s *Store) SnapshotUsage(ctx context.Context, project string) (int, int64, error) {
	vals, err := s.rdb.HVals(ctx, ProjectKeys(project).objects(KindSnapshot)).Result()
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot usage of %s: %w", project, err)
	}
	var bytes int64
	for _, v := range vals {
		var snap struct {
			SizeBytes int64 `json:"size_bytes"`
		}
		if err := json.Unmarshal([]byte(v), &snap); err != nil {
			return 0, 0, fmt.Errorf("snapshot usage of %s: %w", project, err)
		}
		bytes += snap.SizeBytes
	}
	return len(vals), bytes, nil
}

// NodeUse is what one project's sessions hold on one node.
type NodeUse struct{ VCPU, MemoryMiB int }

// NodeUsage answers, per node id, the resources the project's placed live sessions hold
// (pending ones are on no node yet).
func (s *Store) NodeUsage(ctx context.Context, project string) (map[string]NodeUse, error) {
	k := ProjectKeys(project)
	ids, err := s.rdb.SMembers(ctx, k.active()).Result()
	if err != nil {
		return nil, fmt.Errorf("node usage of %s: %w", project, err)
	}
	cmds := make([]*redis.SliceCmd, len(ids))
	if len(ids) > 0 {
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HMGet(ctx, k.session(id), "node", "doc")
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("node usage of %s: %w", project, err)
		}
	}
	return usageFrom(project, cmds)
}

// usageFrom sums, per node, what the project's sessions hold from their node and doc fields
// (HMGET node doc of each).
func usageFrom(project string, cmds []*redis.SliceCmd) (map[string]NodeUse, error) {
	out := map[string]NodeUse{}
	for _, c := range cmds {
		v := c.Val()
		node, _ := v[0].(string)
		doc, _ := v[1].(string)
		if node == "" || doc == "" {
			continue
		}
		var st static
		if err := json.Unmarshal([]byte(doc), &st); err != nil {
			return nil, fmt.Errorf("node usage of %s: %w", project, err)
		}
		u := out[node]
		u.VCPU += st.Resources.VCPU
		u.MemoryMiB += st.Resources.MemoryMiB
		out[node] = u
	}
	return out, nil
}

// putSnapshotScript records a snapshot unless the project's snapshots would then pass the
// plan's count or bytes (a rewrite of a recorded snapshot counts once): the check and the
// write are one step, so snapshots taken at once, through any gateway, cannot pass the plan
// together.
//
// KEYS: objects hash, objects index
// ARGV: id, JSON, max count, max bytes, this snapshot's bytes
var putSnapshotScript = redis.NewScript(`
local all = redis.call('HGETALL', KEYS[1])
local n, used = 0, 0
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] then
    n = n + 1
    local ok, o = pcall(cjson.decode, all[i + 1])
    if ok and type(o) == 'table' and type(o.size_bytes) == 'number' then used = used + o.size_bytes end
  end
end
if n + 1 > tonumber(ARGV[3]) then return {'snapshot_count', n, string.format('%.0f', used)} end
if used + tonumber(ARGV[5]) > tonumber(ARGV[4]) then return {'snapshot_gib', n, string.format('%.0f', used)} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return {'OK'}
`)

// SnapshotLimitError is a snapshot refused because the project's snapshots would pass its
// plan: Limit names the plan field, Count and Bytes are what the project keeps already.
type SnapshotLimitError struct {
	Limit string // "snapshot_count" or "snapshot_gib"
	Count int
	Bytes int64
}

func (e *SnapshotLimitError) Error() string {
	return fmt.Sprintf("the project's %d snapshots of %d bytes leave no room for another under its plan's %s", e.Count, e.Bytes, e.Limit)
}

// PutSnapshot records a snapshot of size bytes as id, or answers a *SnapshotLimitError and
// changes nothing when the project would then keep more than maxCount snapshots or maxBytes.
func (s *Store) PutSnapshot(ctx context.Context, project, id string, snap any, size int64, maxCount int, maxBytes int64) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encode snapshot %s: %w", id, err)
	}
	k := ProjectKeys(project)
	res, err := putSnapshotScript.Run(ctx, s.rdb, []string{k.objects(KindSnapshot), k.objIndex(KindSnapshot)},
		id, b, maxCount, maxBytes, size).Slice()
	if err != nil {
		return fmt.Errorf("put snapshot %s: %w", id, err)
	}
	if len(res) == 3 {
		limit, _ := res[0].(string)
		n, _ := res[1].(int64)
		usedStr, _ := res[2].(string)
		used, _ := strconv.ParseInt(usedStr, 10, 64)
		return &SnapshotLimitError{Limit: limit, Count: int(n), Bytes: used}
	}
	return s.indexSnapshotProject(ctx, project)
}
