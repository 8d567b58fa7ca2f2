package policies

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/store"
)

// Mode says what a policy's verdicts do.
type Mode string

// Modes. Enforce: denials deny, kills kill, stops stop. Warn: they become warnings (grants
// such as allow_egress and defaults still apply). Dryrun: nothing applies; the decision log
// records what would have happened ("would deny").
const (
	ModeEnforce Mode = "enforce"
	ModeWarn    Mode = "warn"
	ModeDryrun  Mode = "dryrun"
)

// Valid reports whether m is one of the three modes.
func (m Mode) Valid() bool { return m == ModeEnforce || m == ModeWarn || m == ModeDryrun }

// Version is one stored revision of a project's policy. Revisions are immutable.
type Version struct {
	ID        string    `json:"id"` // pol_NAME@N
	Name      string    `json:"name"`
	Version   int       `json:"version"`
	Mode      Mode      `json:"mode"`
	Point     string    `json:"point"` // from the module's package
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
	Masked    []string  `json:"masked,omitempty"`
}

// Errors.
var (
	// ErrNotFound: no such policy or version.
	ErrNotFound = errors.New("policies: not found")
	// ErrInvalid: a malformed name, id, mode or source (not a compile error).
	ErrInvalid = errors.New("policies: invalid argument")
)

// MaxSourceBytes bounds an uploaded policy.
const MaxSourceBytes = 256 << 10

// Defaults of Options' limits on what a project stores, in the Redis every tenant shares.
const (
	// DefaultMaxPolicies bounds a project's policy names: every admission and spend decision
	// evaluates the latest version of each, so a few dozen is already more than sensible.
	DefaultMaxPolicies = 64
	// DefaultMaxVersions is how many of a policy's newest versions are kept (each up to
	// MaxSourceBytes, and GET /v1/policies/{name} answers them all): enough to pin a recent
	// one or go back a few; an older one stays while a live session pins it.
	DefaultMaxVersions = 20
	// DefaultPinWindow is how long a version an admission named is kept regardless: far
	// longer than an admission takes from its check of the version to its session's write.
	DefaultPinWindow = 2 * time.Minute
)

// maxRetiredNames bounds the deleted names whose last version the retired hash keeps one by
// one (deleteScript): past it, a delete raises the hash's floor instead, which every new name
// numbers on from, so that the hash does not grow by a name per delete forever.
const maxRetiredNames = 256

// IDPrefix starts every policy id.
const IDPrefix = "pol_"

func validName(name string) bool {
	if len(name) < 1 || len(name) > 64 {
		return false
	}
	for i := range len(name) {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// FormatID answers "pol_NAME@N".
func FormatID(name string, version int) string {
	return IDPrefix + name + "@" + strconv.Itoa(version)
}

// ParseID splits "pol_NAME@N" (version N) or "pol_NAME" (version 0: the latest).
func ParseID(id string) (name string, version int, err error) {
	rest, ok := strings.CutPrefix(id, IDPrefix)
	if !ok {
		return "", 0, fmt.Errorf("%w: policy id %q must look like pol_NAME@N", ErrInvalid, id)
	}
	name = rest
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		name = rest[:i]
		version, err = strconv.Atoi(rest[i+1:])
		if err != nil || version < 1 {
			return "", 0, fmt.Errorf("%w: policy id %q must look like pol_NAME@N with N ≥ 1", ErrInvalid, id)
		}
	}
	if !validName(name) {
		return "", 0, fmt.Errorf("%w: policy name %q must match [a-z0-9_]{1,64}", ErrInvalid, name)
	}
	return name, version, nil
}

// Redis keys of a project's policies and decision log (store/keys.go lays them out).
func latestKey(project string) string { return store.ProjectKeys(project).Policies().Latest() }
func versionsKey(project, name string) string {
	return store.ProjectKeys(project).Policies().Versions(name)
}
func namedKey(project string) string   { return store.ProjectKeys(project).Policies().Named() }
func retiredKey(project string) string { return store.ProjectKeys(project).Policies().Retired() }

// DecisionsKey is the project's decision-log stream.
func DecisionsKey(project string) string { return store.ProjectKeys(project).Policies().Decisions() }

// putScript allocates the next version of a policy and stores it, atomically with the
// checks of the project's limits, so that puts at once, through any gateway, cannot pass
// them together. It answers {'FULL'} for a new name past the most names; {'PINS'}, storing
// nothing, when the versions would pass the most kept and the pins were not given (Put reads
// them and runs it again); else {'OK', N}, having deleted the versions older than the newest
// max that no live session pins and no admission named since the window's start (pinScript:
// a session being admitted with one has not written its pin yet).
//
// A name deleted before numbers on from its last version (retired hash), and every new name
// from the hash's floor (its field "*", which no name can be; see deleteScript), so that no
// id ever names two sources (engines cache compiled versions by id, sessions pin them, the
// decision log names them).
//
// KEYS: latest hash (name → N), versions hash (N → record), named set, retired hash
// ARGV: name, record, max names, max versions, window start (ms), "1" when the pins are
// given, the pinned version numbers
const putScript = `
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return {'FULL'} end
  local last = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or 0)
  local floor = tonumber(redis.call('HGET', KEYS[4], '*') or 0)
  if floor > last then last = floor end
  if last > 0 then redis.call('HSET', KEYS[1], ARGV[1], last) end
  redis.call('HDEL', KEYS[4], ARGV[1])
end
local max = tonumber(ARGV[4])
if ARGV[6] ~= '1' and redis.call('HLEN', KEYS[2]) >= max then return {'PINS'} end
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('HSET', KEYS[2], n, ARGV[2])
if ARGV[6] == '1' then
  local pinned = {}
  for i = 7, #ARGV do pinned[ARGV[i]] = true end
  local since = tonumber(ARGV[5])
  for _, v in ipairs(redis.call('HKEYS', KEYS[2])) do
    local m = tonumber(v)
    if m and m <= n - max and not pinned[v] then
      local at = redis.call('ZSCORE', KEYS[3], ARGV[1] .. '@' .. v)
      if not (at and tonumber(at) >= since) then redis.call('HDEL', KEYS[2], v) end
    end
  end
end
return {'OK', n}`

// pinScript resolves a version for an admission and records, in the same step, that it was
// named now, so that no Put deletes it before the session that names it is written. It
// answers {N, record}, or nil when there is no such policy or version; it also forgets the
// names recorded before the window's start.
//
// KEYS: latest hash, versions hash, named set
// ARGV: name, N (0: the latest), now (ms), window start (ms)
const pinScript = `
local n = ARGV[2]
if n == '0' then
  n = redis.call('HGET', KEYS[1], ARGV[1])
  if not n then return false end
end
local raw = redis.call('HGET', KEYS[2], n)
if not raw then return false end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1] .. '@' .. n)
return {n, raw}`

// record is a stored revision; its name and number are in its keys.
type record struct {
	Mode      Mode      `json:"mode"`
	Point     string    `json:"point"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
	Masked    []string  `json:"masked,omitempty"`
	Source    string    `json:"source"`
}

func (r record) version(name string, n int) Version {
	return Version{ID: FormatID(name, n), Name: name, Version: n, Mode: r.Mode, Point: r.Point,
		Digest: r.Digest, CreatedAt: r.CreatedAt, Masked: r.Masked}
}

func digest(source string) string {
	sum := sha256.Sum256([]byte(source))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func validProject(project string) error {
	if project == "" || strings.ContainsAny(project, "{}") {
		return fmt.Errorf("%w: project id %q", ErrInvalid, project)
	}
	return nil
}

// Put compiles source and stores it as the next version of the project's policy name.
// A source that does not compile, or whose package is not wb.admission, wb.runtime or
// wb.spend, is a *CompileError. An empty mode is enforce. The new version takes effect at
// once on this engine, and on the engines of the gateways before Put returns (they Forget the
// project's set when store.Changes tells them; other engines within Options.Refresh).
// A project has at most Options.MaxPolicies names: a new one past them is a
// *store.ConflictError, and nothing is stored. Each name keeps its newest Options.MaxVersions
// versions and those a live session pinned; Put deletes the others.
func (e *Engine) Put(ctx context.Context, project, name, source string, mode Mode) (Version, error) {
	if err := validProject(project); err != nil {
		return Version{}, err
	}
	if !validName(name) {
		return Version{}, fmt.Errorf("%w: policy name %q must match [a-z0-9_]{1,64}", ErrInvalid, name)
	}
	if mode == "" {
		mode = ModeEnforce
	}
	if !mode.Valid() {
		return Version{}, fmt.Errorf("%w: mode %q must be enforce, warn or dryrun", ErrInvalid, mode)
	}
	if len(source) > MaxSourceBytes {
		return Version{}, fmt.Errorf("%w: policy source is %d bytes, at most %d", ErrInvalid, len(source), MaxSourceBytes)
	}
	c, err := compile(ctx, e.caps, name+".rego", source)
	if err != nil {
		return Version{}, err
	}
	rec := record{Mode: mode, Point: c.point, Digest: digest(source), CreatedAt: time.Now().UTC().Truncate(time.Millisecond),
		Masked: c.masked, Source: source}
	b, err := json.Marshal(rec)
	if err != nil {
		return Version{}, fmt.Errorf("policies: encode %s: %w", name, err)
	}
	n, err := e.storeVersion(ctx, project, name, b)
	if err != nil {
		return Version{}, err
	}
	v := rec.version(name, n)
	p := newPolicy(v, c, nil)
	e.cache.put(project, p)
	e.publish(project, p)
	e.changes.Publish(ctx, project, store.ChangePolicies)
	return v, nil
}

// storeVersion runs putScript for the record b of name, with the pins of the project's live
// sessions when it asks for them, and answers the new version's number.
func (e *Engine) storeVersion(ctx context.Context, project, name string, b []byte) (int, error) {
	keys := []string{latestKey(project), versionsKey(project, name), namedKey(project), retiredKey(project)}
	args := []any{name, b, e.maxPolicies, e.maxVersions, time.Now().Add(-e.pinWindow).UnixMilli(), "0"}
	for {
		res, err := e.putScript.Run(ctx, e.rdb, keys, args...).Slice()
		if err != nil {
			return 0, fmt.Errorf("policies: store %s: %w", name, err)
		}
		switch res[0] {
		case "FULL":
			return 0, &store.ConflictError{Message: fmt.Sprintf(
				"the project already has %d policies, the most it may have; upload a new version of one of them (PUT /v1/policies/{name}) instead", e.maxPolicies)}
		case "PINS":
			if args[5] == "1" {
				return 0, fmt.Errorf("policies: store %s: asked for the pins again", name)
			}
			// A session created between this read and the script pins a version that its
			// admission named (Pin) within the window, which the script keeps too.
			ids, err := e.pins.PinnedPolicies(ctx, project)
			if err != nil {
				return 0, fmt.Errorf("policies: store %s: %w", name, err)
			}
			args[5] = "1"
			for _, id := range ids {
				if pn, pv, err := ParseID(id); err == nil && pn == name && pv > 0 {
					args = append(args, strconv.Itoa(pv))
				}
			}
			continue
		}
		n, ok := res[1].(int64)
		if !ok {
			return 0, fmt.Errorf("policies: store %s: the script answered %v", name, res)
		}
		return int(n), nil
	}
}

// deleteScript deletes every version of a policy, unless an admission named one of them
// since the window's start ({'NAMED', N}: that session may not be written yet, so its pin
// is not visible). It records the last version number (retired hash): under the name while
// the hash has fewer than the most fields given, else as the hash's floor ("*") if above it,
// from which every new name numbers on. (An entry can never be dropped: a session stopped
// with a version pinned, or a decision logged, names it for good.) It answers
// {'OK', versions deleted}, or {'NOTFOUND'}.
//
// KEYS: latest hash, versions hash, named set, retired hash
// ARGV: name, window start (ms), most fields of the retired hash
const deleteScript = `
local last = redis.call('HGET', KEYS[1], ARGV[1])
if not last then return {'NOTFOUND'} end
local since = tonumber(ARGV[2])
for _, v in ipairs(redis.call('HKEYS', KEYS[2])) do
  local at = redis.call('ZSCORE', KEYS[3], ARGV[1] .. '@' .. v)
  if at and tonumber(at) >= since then return {'NAMED', v} end
end
local n = redis.call('HLEN', KEYS[2])
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HLEN', KEYS[4]) < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[4], ARGV[1], last)
elseif tonumber(last) > tonumber(redis.call('HGET', KEYS[4], '*') or 0) then
  redis.call('HSET', KEYS[4], '*', last)
end
return {'OK', n}`

// maxNamedSessions bounds the sessions a refused Delete names.
const maxNamedSessions = 5

// Delete deletes every version of the project's policy name and answers how many there
// were, or ErrNotFound. While a live session pins one of its versions, or an admission named
// one within Options.PinWindow, it deletes nothing and answers a *store.ConflictError that
// names them. The policy stops applying at once on this engine, and on the gateways' before
// Delete returns (store.Changes), as for Put.
func (e *Engine) Delete(ctx context.Context, project, name string) (int, error) {
	if err := validProject(project); err != nil {
		return 0, err
	}
	if !validName(name) {
		return 0, fmt.Errorf("%w: policy name %q must match [a-z0-9_]{1,64}", ErrInvalid, name)
	}
	pins, err := e.pins.PolicyPins(ctx, project)
	if err != nil {
		return 0, fmt.Errorf("policies: delete %s: %w", name, err)
	}
	var pinning []string
	for id, sessions := range pins {
		if pn, _, err := ParseID(id); err == nil && pn == name {
			pinning = append(pinning, sessions...)
		}
	}
	if len(pinning) > 0 {
		slices.Sort(pinning)
		shown := strings.Join(pinning[:min(len(pinning), maxNamedSessions)], ", ")
		if len(pinning) > maxNamedSessions {
			shown += ", …"
		}
		return 0, &store.ConflictError{Message: fmt.Sprintf(
			"policy %s is pinned by %d live session(s) (%s); delete them (DELETE /v1/sessions/{id}) or wait for them to end, then delete the policy",
			IDPrefix+name, len(pinning), shown)}
	}
	res, err := e.deleteScript.Run(ctx, e.rdb, []string{latestKey(project), versionsKey(project, name), namedKey(project), retiredKey(project)},
		name, time.Now().Add(-e.pinWindow).UnixMilli(), e.maxRetired).Slice()
	if err != nil {
		return 0, fmt.Errorf("policies: delete %s: %w", name, err)
	}
	switch res[0] {
	case "NOTFOUND":
		return 0, fmt.Errorf("%w: policy %s", ErrNotFound, IDPrefix+name)
	case "NAMED":
		return 0, &store.ConflictError{Message: fmt.Sprintf(
			"policy %s@%v was named by a session created within the last %s, which may not be running yet; retry after that",
			IDPrefix+name, res[1], e.pinWindow)}
	}
	n, ok := res[1].(int64)
	if !ok {
		return 0, fmt.Errorf("policies: delete %s: the script answered %v", name, res)
	}
	e.Forget(project)
	e.changes.Publish(ctx, project, store.ChangePolicies)
	e.log.InfoContext(ctx, "policies: policy deleted", "project", project, "policy", IDPrefix+name, "versions", n)
	return int(n), nil
}

// Versions answers every version of a policy, oldest first, or ErrNotFound.
func (e *Engine) Versions(ctx context.Context, project, name string) ([]Version, error) {
	if err := validProject(project); err != nil {
		return nil, err
	}
	if !validName(name) {
		return nil, fmt.Errorf("%w: policy name %q must match [a-z0-9_]{1,64}", ErrInvalid, name)
	}
	all, err := e.rdb.HGetAll(ctx, versionsKey(project, name)).Result()
	if err != nil {
		return nil, fmt.Errorf("policies: versions of %s: %w", name, err)
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("%w: policy %s", ErrNotFound, IDPrefix+name)
	}
	out := make([]Version, 0, len(all))
	for f, raw := range all {
		n, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		var rec record
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			return nil, fmt.Errorf("policies: decode %s: %w", FormatID(name, n), err)
		}
		out = append(out, rec.version(name, n))
	}
	slices.SortFunc(out, func(a, b Version) int { return a.Version - b.Version })
	return out, nil
}

// Policies answers the latest version of each of the project's policies, by name.
func (e *Engine) Policies(ctx context.Context, project string) ([]Version, error) {
	recs, err := e.latest(ctx, project)
	if err != nil {
		return nil, err
	}
	out := make([]Version, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.version)
	}
	return out, nil
}

// Get answers one version and its source. id is "pol_NAME@N", or "pol_NAME" for the
// latest version (resolve a request's policy_id with it, then pin the answered ID).
func (e *Engine) Get(ctx context.Context, project, id string) (Version, string, error) {
	name, n, err := ParseID(id)
	if err != nil {
		return Version{}, "", err
	}
	rec, n, err := e.fetch(ctx, project, name, n)
	if err != nil {
		return Version{}, "", err
	}
	return rec.version(name, n), rec.Source, nil
}

// Pin resolves id as Get does, for an admission that will pin the answered version (its ID),
// and records in the same step that it was named: Put keeps a version named within
// Options.PinWindow, so that the version still exists when the session that names it is
// written (from then on the live session pins it).
func (e *Engine) Pin(ctx context.Context, project, id string) (Version, error) {
	name, n, err := ParseID(id)
	if err != nil {
		return Version{}, err
	}
	if err := validProject(project); err != nil {
		return Version{}, err
	}
	now := time.Now()
	res, err := e.pinScript.Run(ctx, e.rdb, []string{latestKey(project), versionsKey(project, name), namedKey(project)},
		name, n, now.UnixMilli(), now.Add(-e.pinWindow).UnixMilli()).StringSlice()
	if errors.Is(err, redis.Nil) {
		if n == 0 {
			return Version{}, fmt.Errorf("%w: policy %s", ErrNotFound, IDPrefix+name)
		}
		return Version{}, fmt.Errorf("%w: policy %s", ErrNotFound, FormatID(name, n))
	}
	if err != nil {
		return Version{}, fmt.Errorf("policies: pin %s: %w", id, err)
	}
	if len(res) != 2 {
		return Version{}, fmt.Errorf("policies: pin %s: the script answered %v", id, res)
	}
	if n, err = strconv.Atoi(res[0]); err != nil {
		return Version{}, fmt.Errorf("policies: pin %s: version %q: %w", id, res[0], err)
	}
	var rec record
	if err := json.Unmarshal([]byte(res[1]), &rec); err != nil {
		return Version{}, fmt.Errorf("policies: decode %s: %w", FormatID(name, n), err)
	}
	return rec.version(name, n), nil
}

// fetch reads version n of name (0: the latest).
func (e *Engine) fetch(ctx context.Context, project, name string, n int) (record, int, error) {
	if err := validProject(project); err != nil {
		return record{}, 0, err
	}
	if n == 0 {
		var err error
		n, err = e.rdb.HGet(ctx, latestKey(project), name).Int()
		if errors.Is(err, redis.Nil) {
			return record{}, 0, fmt.Errorf("%w: policy %s", ErrNotFound, IDPrefix+name)
		}
		if err != nil {
			return record{}, 0, fmt.Errorf("policies: latest of %s: %w", name, err)
		}
	}
	raw, err := e.rdb.HGet(ctx, versionsKey(project, name), strconv.Itoa(n)).Bytes()
	if errors.Is(err, redis.Nil) {
		return record{}, 0, fmt.Errorf("%w: policy %s", ErrNotFound, FormatID(name, n))
	}
	if err != nil {
		return record{}, 0, fmt.Errorf("policies: get %s: %w", FormatID(name, n), err)
	}
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return record{}, 0, fmt.Errorf("policies: decode %s: %w", FormatID(name, n), err)
	}
	return rec, n, nil
}

type stored struct {
	version Version
	source  string
}

// latest reads the latest version of each policy of the project, sorted by name.
func (e *Engine) latest(ctx context.Context, project string) ([]stored, error) {
	if err := validProject(project); err != nil {
		return nil, err
	}
	idx, err := e.rdb.HGetAll(ctx, latestKey(project)).Result()
	if err != nil {
		return nil, fmt.Errorf("policies: list %s: %w", project, err)
	}
	names := make([]string, 0, len(idx))
	for name := range idx {
		names = append(names, name)
	}
	slices.Sort(names)
	cmds := make([]*redis.StringCmd, len(names))
	nums := make([]int, len(names))
	if len(names) > 0 {
		_, err = e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, name := range names {
				nums[i], _ = strconv.Atoi(idx[name])
				cmds[i] = p.HGet(ctx, versionsKey(project, name), idx[name])
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("policies: list %s: %w", project, err)
		}
	}
	out := make([]stored, 0, len(names))
	for i, name := range names {
		raw, err := cmds[i].Bytes()
		if errors.Is(err, redis.Nil) {
			continue // allocated by a Put whose write is not visible yet: cannot happen with the script
		}
		if err != nil {
			return nil, fmt.Errorf("policies: get %s: %w", FormatID(name, nums[i]), err)
		}
		var rec record
		if err := json.Unmarshal(raw, &rec); err != nil {
			return nil, fmt.Errorf("policies: decode %s: %w", FormatID(name, nums[i]), err)
		}
		out = append(out, stored{version: rec.version(name, nums[i]), source: rec.Source})
	}
	return out, nil
}
