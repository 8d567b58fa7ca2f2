package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// IdempotencyTTL is how long an Idempotency-Key is remembered.
const IdempotencyTTL = 24 * time.Hour

// DefaultIdemLease is how long a request's claim on an Idempotency-Key outlives the last
// renewal by its gateway: a gateway killed mid-request stops renewing, and a retry (on any
// gateway) takes the key over this long after. The contract's other failure bound (a dead
// node's sessions fail within 10 s) is the same.
const DefaultIdemLease = 10 * time.Second

// IdemRecord is the first answer given to an Idempotency-Key.
type IdemRecord struct {
	Fingerprint string `json:"fp"`
	Done        bool   `json:"done"`
	// Ref is chosen by the request that first claimed the key and kept by every request that
	// takes the key over: the id of what the request creates (IdemClaim.Ref).
	Ref    string            `json:"ref,omitempty"`
	Status int               `json:"status,omitempty"`
	Header map[string]string `json:"header,omitempty"`
	Body   []byte            `json:"body,omitempty"`
}

// IdemClaim is a request's hold on an Idempotency-Key, from IdemBegin: a lease that its
// gateway renews (IdemRenew) until IdemFinish or IdemRelease.
type IdemClaim struct {
	// Ref is the same for every request that holds the key in turn (session.NewID("", …)
	// of the first claim's time): a handler that names what it creates after it ("sess_" +
	// Ref) makes it once, however many gateways die holding the key.
	Ref string
	// Resumed: the key was taken over from a request that ended without an answer (its
	// gateway died, or it failed retryably): it may have created its object already.
	Resumed bool
	owner   string // this claim's lease token
}

// ErrIdemMismatch: the key was used with another request body.
var ErrIdemMismatch = errors.New("Idempotency-Key was already used with a different request")

// ErrIdemInFlight: the first request with this key is still running.
var ErrIdemInFlight = errors.New("a request with this Idempotency-Key is still in progress; retry it")

// idemBeginScript claims an Idempotency-Key: a new key gets the caller's record and lease;
// a key answered before (same fingerprint) answers its record; a key whose holder's lease
// lapsed (its gateway died) is taken over with its record (and so its ref) as it is. A
// record with no ref is a gateway's from before leases, which renews none: it is never
// taken over, as then. A new record forgets what the project's budget of stored output
// (kept.go) counted under the key, an answer of the key's last use that has expired: the
// budget must not drop it (rewrite the new record to the old answer's stub) later.
//
// KEYS: record, lease, then ProjectKeys.keptKeys (one project: one Cluster slot)
// ARGV: claim record JSON, record TTL ms, lease ms, owner token, fingerprint
// Answers {'NEW'} | {'MISMATCH'} | {'DONE', record} | {'TAKEN', record} | {'HELD'}
var idemBeginScript = redis.NewScript(keepLua + `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3])
  kept_forget(3, KEYS[1])
  return {'NEW'}
end
local raw = redis.call('GET', KEYS[1])
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' then return {'BAD'} end
if rec.fp ~= ARGV[5] then return {'MISMATCH'} end
if rec.done == true then return {'DONE', raw} end
if rec.ref == nil then return {'HELD'} end
if redis.call('SET', KEYS[2], ARGV[4], 'NX', 'PX', ARGV[3]) then return {'TAKEN', raw} end
return {'HELD'}
`)

// idemEndScript ends a claim: 'finish' stores the answer (keeping the record's TTL),
// 'release' leaves the record for a retry to take over, 'forget' deletes it. It does
// nothing when another request holds the lease now (this one's lapsed and a retry took the
// key: its answer stands) or the record is already done. An answer with a stub counts
// against the project's budget of stored output (kept.go).
//
// KEYS: record, lease, then ProjectKeys.keptKeys. ARGV: owner token, mode
// (finish|release|forget), answer record JSON, the stub (empty: none), now ms, budget
// Answers 1 when it changed the record, 0 otherwise.
var idemEndScript = redis.NewScript(keepLua + `
local l = redis.call('GET', KEYS[2])
if l and l ~= ARGV[1] then return 0 end
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local ok, rec = pcall(cjson.decode, raw)
if ok and type(rec) == 'table' and rec.done == true then return 0 end
redis.call('DEL', KEYS[2])
if ARGV[2] == 'finish' then
  redis.call('SET', KEYS[1], ARGV[3], 'XX', 'KEEPTTL')
  local ttl = redis.call('PTTL', KEYS[1])
  if ARGV[4] ~= '' and ttl > 0 then
    keep(3, KEYS[1], #ARGV[3], ARGV[4], tonumber(ARGV[5]) + ttl, ARGV[5], tonumber(ARGV[6]))
  end
elseif ARGV[2] == 'forget' then
  redis.call('DEL', KEYS[1])
end
return 1
`)

// idemRenewScript extends the lease when the caller still holds it. KEYS: lease. ARGV:
// owner token, lease ms. Answers 1 when renewed.
var idemRenewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
`)

// IdemBegin claims key for a request whose fingerprint is fp. It answers the stored record
// when the key has already been answered (same fp), ErrIdemMismatch for another fp,
// ErrIdemInFlight while another request holds it, or a claim when the caller now holds the
// key: a new one, or one taken over from a request whose lease lapsed (Resumed). The caller
// renews the claim (IdemRenew) while it works and ends it with IdemFinish or IdemRelease.
func (s *Store) IdemBegin(ctx context.Context, project, key, fp string) (*IdemRecord, *IdemClaim, error) {
	k := ProjectKeys(project)
	claim := &IdemClaim{Ref: session.NewID("", s.now()), owner: NewAPIKey("")}
	first, _ := json.Marshal(IdemRecord{Fingerprint: fp, Ref: claim.Ref})
	res, err := idemBeginScript.Run(ctx, s.rdb, append([]string{k.idempotency(key), k.idempotencyLease(key)}, k.keptKeys()...),
		first, IdempotencyTTL.Milliseconds(), s.idemLease.Milliseconds(), claim.owner, fp).StringSlice()
	if err != nil {
		return nil, nil, fmt.Errorf("idempotency: %w", err)
	}
	if len(res) == 0 {
		return nil, nil, fmt.Errorf("idempotency record of %s: the script answered nothing", project)
	}
	switch res[0] {
	case "NEW":
		return nil, claim, nil
	case "MISMATCH":
		return nil, nil, ErrIdemMismatch
	case "HELD":
		return nil, nil, ErrIdemInFlight
	case "DONE", "TAKEN":
		var rec IdemRecord
		if len(res) < 2 || json.Unmarshal([]byte(res[1]), &rec) != nil {
			return nil, nil, fmt.Errorf("idempotency record of %s: not JSON", project)
		}
		if res[0] == "DONE" {
			return &rec, nil, nil
		}
		claim.Ref, claim.Resumed = rec.Ref, true
		return nil, claim, nil
	}
	return nil, nil, fmt.Errorf("idempotency record of %s: the script answered %q", project, res[0])
}

// IdemRenew extends c's lease by the store's lease time. It answers false when c no longer
// holds the key (its lease lapsed and another request took it over).
func (s *Store) IdemRenew(ctx context.Context, project, key string, c *IdemClaim) (bool, error) {
	n, err := idemRenewScript.Run(ctx, s.rdb, []string{ProjectKeys(project).idempotencyLease(key)},
		c.owner, s.idemLease.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("idempotency lease: %w", err)
	}
	return n == 1, nil
}

// IdemLease is how long a claim outlives its last renewal; renew well within it.
func (s *Store) IdemLease() time.Duration { return s.idemLease }

// IdemFinish stores the answer for key (keeping the original 24 h window), unless c no
// longer holds the key. With budget (> 0, bytes) and dropped, an answer whose body is
// keptOutputMin or more counts against the project's budget of stored output (kept.go),
// which rewrites it to dropped (an answer that says so) should it go first.
func (s *Store) IdemFinish(ctx context.Context, project, key string, c *IdemClaim, rec IdemRecord, dropped *IdemRecord, budget int64) error {
	rec.Done = true
	rec.Ref = c.Ref
	b, _ := json.Marshal(rec)
	var stub []byte
	if dropped != nil && budget > 0 && len(rec.Body) >= keptOutputMin {
		d := *dropped
		d.Done, d.Ref, d.Fingerprint = true, c.Ref, rec.Fingerprint
		stub, _ = json.Marshal(d)
	}
	return s.idemEnd(ctx, project, key, c, "finish", b, stub, budget)
}

// IdemRelease ends c without an answer, so that the request can be sent again. With forget,
// the key is forgotten (the request wrote nothing: it was refused); without, a retry with
// the same body takes the key over with its ref (the request may have written something:
// the retry must find it, not write it again).
func (s *Store) IdemRelease(ctx context.Context, project, key string, c *IdemClaim, forget bool) error {
	mode := "release"
	if forget {
		mode = "forget"
	}
	return s.idemEnd(ctx, project, key, c, mode, nil, nil, 0)
}

func (s *Store) idemEnd(ctx context.Context, project, key string, c *IdemClaim, mode string, rec, stub []byte, budget int64) error {
	k := ProjectKeys(project)
	if err := idemEndScript.Run(ctx, s.rdb, append([]string{k.idempotency(key), k.idempotencyLease(key)}, k.keptKeys()...),
		c.owner, mode, rec, stub, s.now().UnixMilli(), budget).Err(); err != nil {
		return fmt.Errorf("idempotency %s: %w", mode, err)
	}
	return nil
}
