package store

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"wb/session"
)

// This file lays out the whole Redis key space: every key and channel any package uses, what
// it holds, its type and who writes it. No other package builds a key: they take them from
// here. The names are fixed (stored data and Lua scripts depend on them; keys_test.go holds
// every one).
//
// Every key of a project carries the project as hash tag, "wb:{PROJECT}:…", so each script and
// transaction touches one Redis Cluster slot. The few global keys have no tag: on one Redis (no
// Cluster) the create and transition scripts write the signal streams and the session indexes
// too, and on a Cluster a pipeline after the script does (indexes.go).

// Global keys.
const (
	// ProjectsKey is a set of every project id; consumers of per-project streams walk it.
	// Written by store (CreateProject, EnsureProject).
	ProjectsKey = "wb:projects"

	// NodesKey is a hash of node registrations, node id → NodeInfo JSON. Written by store
	// (Heartbeat, from every `wb node`; Forget).
	NodesKey = "wb:nodes"

	// NodesDrainingKey is a set of the ids of the nodes an operator is draining: they take no
	// new sessions and the edge marks them DRAINING. Apart from NodesKey so that a node's
	// heartbeat, which rewrites its registration, never undoes a drain. Written by store
	// (SetNodeDraining, from the admin API).
	NodesDrainingKey = "wb:nodes:draining"

	// GatewaysKey is a hash of gateway registrations, gateway id → GatewayInfo JSON. Nodes
	// read it to refuse guests' egress to any gateway, including ones that have not called
	// them yet. Written by store (GatewayHeartbeat).
	GatewaysKey = "wb:gateways"

	// WebhooksDueKey is a sorted set of the projects with webhook deliveries queued, score
	// the time in ms at which the earliest may be attempted (or at which a dispatcher's
	// lease on the project or on one of its deliveries ends): dispatchers wait for its first
	// member instead of polling every project. Written by webhooks' dispatcher.
	WebhooksDueKey = "wb:webhooks:due"

	// provisionDeadlinesKey is a sorted set of the sessions that may still be pending or
	// provisioning, member "PROJECT/SESSION", score the provisioning deadline in ms. Written by
	// store (Create adds with or after the session's write; Transition removes when it leaves
	// provisioning; ScheduleProvisionDeadline, ForgetProvisionDeadlines); read by the placer
	// (DueProvisionDeadlines), which fails the sessions past theirs.
	provisionDeadlinesKey = "wb:deadlines:provision"

	// snapshotProjectsKey is a set of the projects that have snapshots (perhaps none left).
	// Written by store (PutObject and PutSnapshot after the snapshot, ForgetSnapshotProject,
	// IndexSnapshotProjects); read by quota's settler to bill snapshot storage.
	snapshotProjectsKey = "wb:snapshots:projects"

	// capStopProjectsKey is a set of the projects with held spend-cap stops (CapStops; perhaps
	// none left). Written by store (HoldCapStop, then ForgetCapStopProject); read by quota's
	// settler, which carries the stops on (quota.Enforcer.RetryStops).
	capStopProjectsKey = "wb:caps:stopping"

	// capUndecidedProjectsKey is a set of the projects with undecided spend-cap stops
	// (CapUndecided; perhaps none left). Written by store (IndexCapUndecided, for quota.Caps,
	// then ForgetCapUndecidedProject); read by quota's settler, which decides the crossings
	// their settler left (quota.Enforcer.RetryStops). Apart from capStopProjectsKey, which
	// settlers older than the undecided stops prune of the projects whose held stops they do
	// not see.
	capUndecidedProjectsKey = "wb:caps:undecided"

	// desktopIdleKey is a sorted set of the awake desktops, member "PROJECT/DESKTOP", score the
	// time in ms at which each falls idle (its last use plus the idle time). Written by store
	// (SetDesktopIdle, ForgetDesktopIdle, DeleteDesktop); read by the gateway's idle loop
	// (DueDesktopIdle), which puts to sleep those still unused at their deadline.
	desktopIdleKey = "wb:deadlines:desktop_idle"

	// desktopSweepKey is a string, the token of the gateway whose turn it is to walk every
	// desktop (the desktop sweep), which ends one sweep period after that gateway's last pass.
	// Written by store (TakeDesktopSweep: a free turn taken as SET NX PX takes it, or extended
	// by its holder at each pass); read by every gateway's sweep, which walks only in its turn, so that
	// the fleet walks every desktop once a period, not once per gateway. A holder that dies
	// stops extending it, and another gateway takes the next turn once it ends. Gateways older
	// than it do not read it: during a rolling deploy each walks in every period, as before.
	desktopSweepKey = "wb:sweeps:desktops"

	// desktopWorkKey, snapshotWorkKey and runWorkKey, with their holders hashes
	// (desktopWorkerKey, snapshotWorkerKey, runWorkerKey), are the lease sets of before the
	// sets had shards (workShardKeys): every desktop's transition, every snapshot and every run
	// of the whole fleet wrote one key of its set, one Cluster slot. The desktops': member
	// "PROJECT/DESKTOP", a desktop's transition (starting, stopping), holder its work's token
	// (none for a lease set ahead of the transition). The snapshots': member "PROJECT/SESSION",
	// a session in snapshotting, holder the snapshot's id. The runs': member
	// "PROJECT/RUN/ATTEMPT", an attempt at a run, holder the attempt or its recovery.
	//
	// Gateways (and placers) older than the shards write and read only these. Binaries that
	// know the shards read both (the Due… of each set, every pass), and write their leases in
	// one of them: the runs' in the shards; the desktops' and the snapshots' here, in this
	// release, as the older binaries do (which see only these: a lease they do not see they
	// would take over beside its work), and in the shards from the release that sets
	// writeDesktopAndSnapshotLeasesInShards (which rolls out over this one, that reads them).
	// The work of a binary that writes in the other keys and dies during a rolling deploy is
	// taken over: a claim that does not apply in this binary's keys is tried in the other, and
	// one that applies moves the lease to this binary's, leaving there its holder and no end
	// (a lease that no binary answers due or claims, and whose other holder's renewals fail
	// unless it is that holder still, as a snapshot's is); an ensure leaves alone a lease in
	// the other keys; and a desktop's or a snapshot's set, which supersedes the lease's holder,
	// supersedes one there the same way. So, once the shards are written and no older binary
	// runs, these keep no lease that ends, and at most a holder for each lease so moved or
	// superseded (a few, from the deploy; nothing reads them). One hash tag per set: one
	// script writes both of its keys.
	desktopWorkKey    = "wb:{desktops}:work"
	desktopWorkerKey  = "wb:{desktops}:worker"
	snapshotWorkKey   = "wb:{snapshots}:work"
	snapshotWorkerKey = "wb:{snapshots}:worker"
	runWorkKey        = "wb:{runs}:work"
	runWorkerKey      = "wb:{runs}:worker"

	// legacyRunsMovedKey is a string, the time at which a gateway finished moving every
	// project's runs out of the hash they had before each had a key of its own (objects of
	// kind "run"): while it is missing, each gateway that starts moves what is left. Written by
	// store (MigrateLegacyRuns).
	legacyRunsMovedKey = "wb:migrated:runs"

	// edgeSecretKey is a string of 32 random bytes that gateways and nodes share to sign and
	// verify the edge's grants (internal/edgeauth). Written once by whoever reads it first
	// (EdgeSecret, SET NX); never rotated while the fleet runs.
	edgeSecretKey = "wb:edge:secret"

	// ChangesChannel is a Pub/Sub channel (sharded Pub/Sub in a Redis Cluster, where a plain
	// PUBLISH counts one node's subscribers only) of ProjectChange messages, JSON: a project whose
	// configuration that gateways cache (its API keys, its plan, its policies, its plugins)
	// has changed. Published by store (Changes.Publish: the store's own writes, policies.Engine
	// and plugins.Host); every gateway subscribes (Changes.Watch).
	ChangesChannel = "wb:changes"

	// StartsChannel is a Pub/Sub channel of the sessions that left pending and provisioning
	// (they run, or stop or end first), each message a session's "PROJECT/SESSION". Published
	// by transitionScript: a plain PUBLISH, which on a Cluster reaches the subscribers of
	// every node (a script may publish on a sharded channel of its own slot only, and a
	// gateway cannot subscribe to every project's). Gateways subscribe (Store.WatchStarts) to
	// see a run's session start without looking at it every millisecond.
	StartsChannel = "wb:starts"
)

// workShards is how many shards each sharded lease set has (the runs', the desktops' and the
// snapshots'). Fixed: a lease's shard follows from the id of what it is on (workShard), so a
// gateway that counted another number would look for a lease in the wrong key, and leave
// those of the shards it does not know unrecovered.
const workShards = 16

// workShardKeys names shard i of the lease set set ("runs", "desktops", "snapshots"): ends is
// a sorted set of the leases, member as in the set of before the shards (runWorkKey,
// desktopWorkKey, snapshotWorkKey), score the time in ms at which the lease ends, and holders
// a hash from the same member to the lease's holder. The leases on one thing (a run, a
// desktop, a session) are in shard workShard(its id). Written by store (shardedLeases: the
// Set, Renew, Release, Claim and Ensure of RunWork, DesktopWork, SnapshotWork); read by every
// gateway's recovery loops (DueRunWork, DueDesktopWork, DueSnapshotWork, every shard in one
// pass), which take over or end the work of a gateway that stopped. One hash tag per shard
// ("runs.I"): one script writes both keys of a shard, and the shards spread over a Cluster's
// slots (16 tags over three masters' default ranges: 5, 7 and 4 for runs, 4, 6 and 6 for
// desktops, 4, 5 and 7 for snapshots), so that the work of a busy fleet does not all write one
// key. Before the shards, one pair of keys held each set's leases; the desktops' and the
// snapshots' are still written there in this release, and read here too
// (writeDesktopAndSnapshotLeasesInShards says until when).
func workShardKeys(set string, i int) (ends, holders string) {
	tag := "wb:{" + set + "." + strconv.Itoa(i) + "}:"
	return tag + "work", tag + "worker"
}

// workShard is the shard of a lease set that holds the leases on id: FNV-1a of the id, modulo
// workShards. Fixed, as workShards is: every gateway must find a lease where another put it.
func workShard(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % workShards)
}

// changeAckKey is a list, one element per subscriber that has dropped its copy of what
// ProjectChange id announced, with a short TTL. Written by each gateway (Changes.Watch); the writer
// pops from it (BLPOP) until every subscriber has answered or its wait is over.
func changeAckKey(id string) string { return "wb:changes:ack:" + id }

// TLS certificates and ACME state: certmagic's Storage (CertStorage), shared by every gateway
// that serves TLS so that one issues and all serve. One hash tag for the lot: one Cluster slot,
// so a folder's Delete and the index stay one script (the set is small: a few KiB a name).
const (
	// certFilesKey is a hash, certmagic key → value: certificates, their private keys and
	// metadata, ACME accounts, challenge tokens. Written by store (CertStorage).
	certFilesKey = "wb:{tls}:files"

	// certModifiedKey is a hash, certmagic key → the time in ms it was last stored.
	certModifiedKey = "wb:{tls}:modified"

	// certIndexKey is a sorted set (score 0, by key) of the keys in certFilesKey, for listing a
	// folder as a range.
	certIndexKey = "wb:{tls}:index"
)

// certLockKey is a string, the token of the CertStorage holding certmagic's lock name (an
// issuance, a renewal), with a lease its holder renews. Written by store (CertStorage.Lock).
func certLockKey(name string) string { return "wb:{tls}:lock:" + name }

// nodeSessionsKey is a set of the sessions placed on one node and not yet ended (perhaps
// some that have), members "PROJECT/SESSION". Written by store (Transition adds when it
// places, removes on a terminal state; AddNodeSession, ForgetNodeSessions); read by the
// placer (NodeSessions) to fail them when the node's heartbeat lapses. Its own hash tag:
// one node's set is one slot.
func nodeSessionsKey(node string) string { return "wb:node:{" + node + "}:sessions" }

// nodeClaimsKey is a sorted set of the placements made on one node that its heartbeat may not
// reflect yet, member "SESSION|TOKEN|VCPU|MEMORY_MIB" (the token names the one claim, so a
// placer releases its own only; members of before it are "SESSION|VCPU|MEMORY_MIB"), score
// the time in ms of the claim; it expires with its newest claim's window. Written by store
// (ClaimOnNode, ReleaseOnNode) for every placer, so that placers of several gateways never
// fill the same free room; read by the placer (ReadPlacement) to rank nodes. Its node's hash
// tag: one script, one slot.
func nodeClaimsKey(node string) string { return "wb:node:{" + node + "}:claims" }

// nodeRoomKey is a hash of one node's capacity and use as its latest heartbeat reported them
// (fields vcpu, memory_mib, used_vcpu, used_memory_mib, and projects: what each project's guests hold, roomProjects): NodesKey's figures again, in the
// node's slot, so that the claim script checks a claim against the node's heartbeat as it is
// then, not as a placer read it before (a heartbeat since may show a session whose claim is
// gone). Written by store (Heartbeat; RemoveNode deletes it); read by the claim script
// (ClaimOnNode). It lapses a few heartbeats after the latest (roomBeats), when the claim
// script falls back to the placer's read.
func nodeRoomKey(node string) string { return "wb:node:{" + node + "}:room" }

// signalKey is a stream of signals of one kind of work, field p the project with work,
// trimmed to about signalMaxLen entries. Written by store (Signal; the create and transition
// scripts on one Redis) with or after every write that makes such work; read by the worker of that kind with a consumer group (Signals).
func signalKey(w Work) string { return "wb:signal:" + string(w) }

// The signal keys of a create (createSignals), as constants: signalKey's concatenation was two
// of a create's allocations.
const (
	pendingSignalKey = "wb:signal:" + string(WorkPending)
	outboxSignalKey  = "wb:signal:" + string(WorkOutbox)
)

// apiKeyHashKey is a string, the project id an API key belongs to, under the key's SHA-256 in
// hex (sum, as a project's apiKeys index holds it; the key itself is never stored):
// "wb:apikey:HEX". Written by store (CreateProject, AddAPIKey).
func apiKeyHashKey(sum string) string { return "wb:apikey:" + sum }

// apiKeyHash is the hex SHA-256 of an API key.
func apiKeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// ProjectKeyspace names every key of one project.
type ProjectKeyspace struct{ p string } // "wb:{PROJECT}:"

// ProjectKeys answers the keys of project.
func ProjectKeys(project string) ProjectKeyspace { return ProjectKeyspace{"wb:{" + project + "}:"} }

// Sessions, written only by store's scripts.

// session is a hash: one session (doc JSON, state, ver, timers, node, desk — the desktop it
// runs, from its metadata, …), and its usage to date (u_ms, u_paused_ms, u_cpu, u_mem,
// u_egress, cost_nano, through u_seq) from AddSessionUsage.
func (k ProjectKeyspace) session(id string) string { return k.p + "s:" + id }

// ActiveSet is the set of session ids holding the project's concurrency slots (active), for
// tests that say what holds one.
func (k ProjectKeyspace) ActiveSet() string { return k.active() }

// SessionHash is the session's hash (session), for quota's settle script, which reads its
// desk field only.
func (k ProjectKeyspace) SessionHash(id string) string { return k.session(id) }

// all is a sorted set (score 0, by id) of every session, for listing.
func (k ProjectKeyspace) all() string { return k.p + "all" }

// byState is a sorted set (score 0, by id) of the sessions in state s.
func (k ProjectKeyspace) byState(s session.State) string { return k.p + "st:" + string(s) }

// byEndUser is a sorted set (score 0, by id) of the end user's sessions.
func (k ProjectKeyspace) byEndUser(endUser string) string { return k.p + "eu:" + endUser }

// retained is a sorted set of the project's ended sessions, each "ID/END_USER" (END_USER
// empty for none), scored with the time (Unix ms) its retention lapses: trimRetained drops
// the index entries (all, byState, byEndUser) of those whose hash has expired since.
func (k ProjectKeyspace) retained() string { return k.p + "retained" }

// active is a set of the session ids holding a concurrency slot.
func (k ProjectKeyspace) active() string { return k.p + "active" }

// reservations is a sorted set of the session ids holding a slot (in active) before their
// session is written, scored with the time (ms) the hold lapses: a create whose decision
// needs the slots in use holds one while it is decided (Reserve).
func (k ProjectKeyspace) reservations() string { return k.p + "reservations" }

// reservationHolders is a hash from each id in reservations to the token of the request that
// holds its slot (see reserveScript).
func (k ProjectKeyspace) reservationHolders() string { return k.p + "reservations:holders" }

// Outbox is a stream of the project's events: every transition appends to it in the same
// script (store), and anything else that must reach webhooks appends through AppendEvent,
// each trimming it to about outboxMaxLen entries. Read by webhooks' dispatcher (consumer
// group "webhooks"), which trims what every group has acknowledged.
func (k ProjectKeyspace) Outbox() string { return k.p + "outbox" }

// outboxMaxLen bounds an outbox (approximately, XADD MAXLEN ~) whatever reads it: a project
// with no endpoint, or a dispatcher down for long, cannot grow it without bound.
// outboxMaxLenLua is the same number as the scripts spell it.
const (
	outboxMaxLen    = 100_000
	outboxMaxLenLua = "100000"
)

// Outbox is ProjectKeys(project).Outbox().
func Outbox(project string) string { return ProjectKeys(project).Outbox() }

// placing is a string, the token of the placer holding the project's placement lock (with a
// lease); placeAgain is a string flag asking its holder for another round. Written by store
// (LockPlacement).
func (k ProjectKeyspace) placing() string    { return k.p + "placing" }
func (k ProjectKeyspace) placeAgain() string { return k.p + "placing:again" }

// settling and settleAgain are the same for settling the project's usage (LockSettlement).
func (k ProjectKeyspace) settling() string    { return k.p + "settling" }
func (k ProjectKeyspace) settleAgain() string { return k.p + "settling:again" }

// Desktops, written only by store (desktops.go).

// desktop is a hash: one desktop record (doc JSON, ver, state), and its last use in ms (used),
// which a touch writes without a new version.
func (k ProjectKeyspace) desktop(id string) string { return k.p + "d:" + id }

// desktops is a sorted set (score 0, by id) of the project's desktops, for listing.
func (k ProjectKeyspace) desktops() string { return k.p + "desktops" }

// project is a hash: the project's name and plan (granted and lowered limits). Written by
// store.
func (k ProjectKeyspace) project() string { return k.p + "project" }

// apiKeys is a hash, an API key's prefix (KeyPrefix) → the key's SHA-256 in hex: the
// project's keys, by the part of each that may be shown, so that an operator can revoke one.
// Written by store (AddAPIKey, RevokeAPIKey).
func (k ProjectKeyspace) apiKeys() string { return k.p + "apikeys" }

// objects is a hash, id → JSON, of the project's objects of one kind (snapshots; runs, before
// each had a key of its own, which runs_legacy.go moves out); objIndex is a sorted set (score
// 0, by id) of the same ids, for listing. Written by store.
func (k ProjectKeyspace) objects(kind string) string  { return k.p + "obj:" + kind }
func (k ProjectKeyspace) objIndex(kind string) string { return k.p + "idx:" + kind }

// run is a string, one run's JSON (output included, and the attempt that owns it), with the
// store's retention as TTL from its last write. Written by store (CreateRun, StartRun,
// FinishRun, FailRun, PutRun).
func (k ProjectKeyspace) run(id string) string { return k.p + "run:" + id }

// kept is a sorted set of the project's stored outputs that count against its byte budget
// (a run's record with its output, an Idempotency-Key's answer kept for replays), member the
// key that holds one, score the time in ms it was written; keptExpiry is the same members,
// score the time in ms at which the key expires; keptSizes is a hash from the same member to
// its bytes, and field "total" to their sum; keptStubs is a hash from the same member to what
// the key is rewritten to should the budget drop its output (the run without it; the key's
// answer saying its replay was dropped). All four expire with their last member. Written by
// store (keepLua: FinishRun, IdemFinish).
func (k ProjectKeyspace) kept() string       { return k.p + "kept" }
func (k ProjectKeyspace) keptExpiry() string { return k.p + "kept:exp" }
func (k ProjectKeyspace) keptSizes() string  { return k.p + "kept:size" }
func (k ProjectKeyspace) keptStubs() string  { return k.p + "kept:stub" }

// keptKeys are the four keys of the project's budget of stored output, as keepLua takes them.
func (k ProjectKeyspace) keptKeys() []string {
	return []string{k.kept(), k.keptExpiry(), k.keptSizes(), k.keptStubs()}
}

// idempotency is a string: one Idempotency-Key's record as JSON (fingerprint, ref, state and
// stored answer), under the key's SHA-256, with a TTL. Written by store (IdemBegin,
// IdemFinish, IdemRelease).
func (k ProjectKeyspace) idempotency(key string) string {
	sum := sha256.Sum256([]byte(key))
	return k.p + "idem:" + hex.EncodeToString(sum[:])
}

// idempotencyLease is a string with a short TTL: the token of the request that holds the
// Idempotency-Key now, renewed by its gateway while it works. A record with no lease and no
// answer was left by a request that died (or failed retryably): a retry takes it over.
// Written by store (IdemBegin, IdemRenew, IdemFinish, IdemRelease).
func (k ProjectKeyspace) idempotencyLease(key string) string { return k.idempotency(key) + ":lease" }

// Money and limits, written by quota.

// Limits is a hash: the project's spend caps in micro-USD, fields cap and eu_cap (PUT
// /v1/limits). Written by quota.Accounts.
func (k ProjectKeyspace) Limits() string { return k.p + "limits" }

// CapFlag is a string, the spend in micro-USD when the project's cap of level (soft | hard)
// was crossed in month (YYYYMM), with a 40-day TTL; while the hard one exists, admissions
// answer 402 (store's Admit reads them in its script). Written by quota.Caps; the hard one
// also by quota.Accounts for a soft cap's decision that denies admissions, its value then
// "soft:" and the spend (quota.Caps still flags the hard cap over it). Deleted by
// quota.Accounts (a raised cap) and quota.Enforcer (a decision that lifts the stop).
func (k ProjectKeyspace) CapFlag(level, month string) string {
	return k.p + "capped:" + level + ":" + month
}

// EndUserCapFlag is CapFlag for one end user's cap.
func (k ProjectKeyspace) EndUserCapFlag(endUser, level, month string) string {
	return k.p + "capped:" + level + ":eu:" + endUser + ":" + month
}

// CapLifted is a string flag: the project's hard cap was crossed in month and a spend
// decision let admissions go on, so its CapFlag was deleted; with the same TTL. quota.Caps
// reads it with the flag, so that the cap, crossed, is not crossed again by every record
// settled after. Written by quota.Enforcer (with the flag's deletion); deleted by
// quota.Accounts with the flags (a raised cap).
func (k ProjectKeyspace) CapLifted(month string) string { return k.p + "capped:lifted:" + month }

// EndUserCapLifted is CapLifted for one end user's cap.
func (k ProjectKeyspace) EndUserCapLifted(endUser, month string) string {
	return k.p + "capped:lifted:eu:" + endUser + ":" + month
}

// CapSoftDeny is a string, the value a soft cap's decision that denied admissions gave the
// project's hard CapFlag in month ("soft:" and the spend), with the flags' TTL: the hard cap
// crossed after it overwrites the flag with its spend, and a raise that leaves the spend
// under the hard cap but past the soft level sets the flag back from it (the soft deny
// stands). Written by quota.Accounts with the flag; deleted by quota.Accounts with the soft
// flag (a raised cap). Binaries older than it neither read nor write it.
func (k ProjectKeyspace) CapSoftDeny(month string) string { return k.p + "capped:softdeny:" + month }

// EndUserCapSoftDeny is CapSoftDeny for one end user's cap.
func (k ProjectKeyspace) EndUserCapSoftDeny(endUser, month string) string {
	return k.p + "capped:softdeny:eu:" + endUser + ":" + month
}

// CapStops is a hash of the stops ordered by a crossed spend cap that left sessions live (a
// stop failed through every pass): field MONTH (the project's cap) or MONTH:eu:END_USER (an
// end user's), with :soft after it for a soft cap's decision → the stop's scope as JSON, with
// the cap flags' TTL. Written by store (HoldCapStop, EndCapStop) for quota.Enforcer, which
// retries them until nothing in scope is live; deleted by quota.Accounts with the cap's
// flags (a raised cap).
func (k ProjectKeyspace) CapStops() string { return k.p + "capped:stops" }

// CapUndecided is a hash of the caps' crossings not yet decided: field as CapStops' with
// :undecided after it (a hard cap's) or :soft:undecided (a soft one's, which binaries older
// than them never take over) → the crossing as JSON, with the cap flags' TTL; written by quota.Caps
// with the cap's flag, in one script, and replaced by the decision (store's
// ReplaceCapUndecided, EndCapUndecided, for quota.Enforcer, which decides the crossings their
// settler left); deleted by quota.Accounts with the cap's flags (a raised cap). Apart from
// CapStops, which settlers older than it read as stops to carry on at once.
func (k ProjectKeyspace) CapUndecided() string { return k.p + "capped:undecided" }

// CappedEndUsers is a set, the end users whose EndUserCapFlag (of either level) was set in
// month, with the flags' TTL: a raised end-user cap lifts their flags. Written by quota.Caps
// (before the flag); pruned by quota.Accounts.
func (k ProjectKeyspace) CappedEndUsers(month string) string {
	return k.p + "capped:eus:" + month
}

// RateBucket is a hash, fields tokens and ts (ms), the project's token bucket of creates,
// with a TTL of one refill. Written by store's token-bucket scripts (TakeToken, for
// quota.RateLimiter; Admit, for creates).
func (k ProjectKeyspace) RateBucket() string { return k.p + "rl" }

// UsageStream is a stream of usage records (fields as quota.Record.Values), one per interval
// of one session. Written by nodes (store.AppendUsage); read by quota's settler (consumer
// group "settler"), which trims what it has acknowledged (StreamTrimLua).
func (k ProjectKeyspace) UsageStream() string { return k.p + "usage" }

// UsageSeq is a hash, session id → the last usage seq settled into the spend counters.
// Written by quota's settle script, which it makes exactly-once; UsageSeqAt is a sorted set
// of the same session ids, score the time in ms each was last settled, by which quota's
// settler drops the sessions settled longer ago than a replay could come (from both).
func (k ProjectKeyspace) UsageSeq() string   { return k.p + "usage:seq" }
func (k ProjectKeyspace) UsageSeqAt() string { return k.p + "usage:seq:at" }

// Spend is a hash of settled spend in nano-USD: fields m:YYYYMM, d:YYYYMMDD, h:YYYYMMDDHH for
// the project and eu:END_USER:m:… (d:, h:) for each end user. Written by quota's settle and
// accrual scripts. SpendHours is a sorted set of its hourly fields (h:…, eu:…:h:…), score
// the hour's start in ms, SpendDays of its daily ones (d:…, eu:…:d:…), score the day's
// start, and SpendMonths of its monthly ones (m:…, eu:…:m:…), score the month's end, by
// which quota's settler drops the hours, days and months no reader needs any more (from
// both).
func (k ProjectKeyspace) Spend() string       { return k.p + "spend" }
func (k ProjectKeyspace) SpendHours() string  { return k.p + "spend:hours" }
func (k ProjectKeyspace) SpendDays() string   { return k.p + "spend:days" }
func (k ProjectKeyspace) SpendMonths() string { return k.p + "spend:months" }

// Indexed is a string flag: the entries of UsageSeq and the hourly fields of Spend written
// before UsageSeqAt and SpendHours existed are in them ("1"), and its daily fields written
// before SpendDays existed are in it too ("2"). Written once by quota's settler.
func (k ProjectKeyspace) Indexed() string { return k.p + "usage:indexed" }

// IndexedMonths is a string flag: the monthly fields of Spend written before SpendMonths
// existed are in it ("1"). A flag apart from Indexed: a new version of that one would have
// settlers older than it, which set their own, index the project again at every sweep of a
// rolling deploy. Written once by quota's settler.
func (k ProjectKeyspace) IndexedMonths() string { return k.p + "usage:indexed:months" }

// UsageHour is a hash, the usage settled in the hour of t (UTC): s:SESSION:METRIC,
// e:END_USER:METRIC and t:METRIC, with a 400-day TTL; GET /v1/usage sums them; and
// sd:SESSION → the desktop the session ran, for a desktop's sessions, so that the report
// names it for as long as the usage lasts (the session itself is kept only days after it
// ends). Written by quota's settle and accrual scripts.
func (k ProjectKeyspace) UsageHour(t time.Time) string {
	return k.p + "usage:h:" + t.UTC().Format("2006010215")
}

// SnapshotAccrual is a hash, snapshot id → the time in ms up to which its storage is billed.
// Written by quota's accrual script.
func (k ProjectKeyspace) SnapshotAccrual() string { return k.p + "snapacc" }

// Policies names the keys of the project's Rego policies and decision log.
func (k ProjectKeyspace) Policies() PolicyKeys { return PolicyKeys{k.p} }

// PolicyKeys are the keys of one project's policies, written by policies.Engine.
type PolicyKeys struct{ p string }

// Latest is a hash, policy name → its latest version number.
func (k PolicyKeys) Latest() string { return k.p + "pol:latest" }

// Versions is a hash, version number → that revision's JSON (source included).
func (k PolicyKeys) Versions(name string) string { return k.p + "pol:v:" + name }

// Named is a sorted set, "NAME@N" → when (Unix ms) an admission last named that version
// (policies.Engine.Pin): Put keeps the versions named within its pin window.
func (k PolicyKeys) Named() string { return k.p + "pol:named" }

// Retired is a hash, deleted policy name → its last version number: a policy put again
// under that name numbers on from there, so that no id ever names two sources. It keeps a
// bounded number of names; past them a delete raises its field "*" (no name can be "*")
// instead, from which every new name numbers on.
func (k PolicyKeys) Retired() string { return k.p + "pol:retired" }

// Decisions is a stream, the masked decision log of every decision point, trimmed.
func (k PolicyKeys) Decisions() string { return k.p + "decisions" }

// Webhooks names the keys of the project's webhook endpoints and deliveries.
func (k ProjectKeyspace) Webhooks() WebhookKeys { return WebhookKeys{k.p + "wh:"} }

// WebhookKeys are the keys of one project's webhooks, written by webhooks' registry and
// dispatcher.
type WebhookKeys struct{ p string }

// Endpoints is a hash, endpoint id → endpoint JSON, secret included.
func (k WebhookKeys) Endpoints() string { return k.p + "endpoints" }

// Log is a stream of the endpoint's delivery attempts, trimmed to webhooks.MaxLogEntries.
func (k WebhookKeys) Log(endpoint string) string { return k.p + "log:" + endpoint }

// Due is a sorted set of queue names ("ENDPOINT/SESSION"); the score is the time in ms at
// which the queue's head may next be attempted, or the end of the lease of the dispatcher
// that is attempting it.
func (k WebhookKeys) Due() string { return k.p + "due" }

// Queue is a list of pending deliveries to one endpoint for one session (queue name
// "ENDPOINT/SESSION", session "" for project-wide events), oldest first; the head is the one
// being attempted.
func (k WebhookKeys) Queue(name string) string { return k.p + "q:" + name }

// QueueMeta is a hash holding the queue head's attempt count and first attempt time.
func (k WebhookKeys) QueueMeta(name string) string { return k.p + "qm:" + name }

// QueuedBytes is a hash, endpoint id → the bytes of the deliveries queued for it (all its
// sessions' queues), which the dispatcher keeps under its bound.
func (k WebhookKeys) QueuedBytes() string { return k.p + "queued" }

// Owner is a string, the dispatcher that consumes the project's outbox, with a TTL.
func (k WebhookKeys) Owner() string { return k.p + "owner" }

// Again is a string flag, with a TTL, set by a dispatcher that found the outbox held by
// another: the holder reads the outbox once more before it lets go.
func (k WebhookKeys) Again() string { return k.p + "again" }

// Plugins names the keys of the project's Wasm plugins.
func (k ProjectKeyspace) Plugins() PluginKeys { return PluginKeys{k.p + "plugin:"} }

// PluginKeys are the keys of one project's plugins, written by plugins.Host.
type PluginKeys struct{ p string }

// Meta is a hash, plugin name → Plugin JSON (config included).
func (k PluginKeys) Meta() string { return k.p + "meta" }

// Wasm is a string, the module with the given sha256 digest ("sha256:HEX" or HEX), shared by
// every name that has that digest.
func (k PluginKeys) Wasm(digest string) string {
	return k.p + "wasm:" + strings.TrimPrefix(digest, "sha256:")
}

// Limits is a hash, fields pages and timeout_ms: the project's plugin limits.
func (k PluginKeys) Limits() string { return k.p + "limits" }

// Version is a counter bumped by every change of the keys above; replicas poll it to see a
// change made through another one.
func (k PluginKeys) Version() string { return k.p + "ver" }
