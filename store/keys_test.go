package store

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"wb/session"
)

// TestKeyNames pins every key's name: stored data and Lua scripts depend on them, so a
// constructor that answers another name is a migration, not a refactor.
func TestKeyNames(t *testing.T) {
	t.Parallel()
	k := ProjectKeys("proj_1")
	hour := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("x", 3600))
	for _, c := range []struct{ got, want string }{
		{ProjectsKey, "wb:projects"},
		{NodesKey, "wb:nodes"},
		{GatewaysKey, "wb:gateways"},
		{WebhooksDueKey, "wb:webhooks:due"},
		{provisionDeadlinesKey, "wb:deadlines:provision"},
		{snapshotProjectsKey, "wb:snapshots:projects"},
		{capStopProjectsKey, "wb:caps:stopping"},
		{capUndecidedProjectsKey, "wb:caps:undecided"},
		{edgeSecretKey, "wb:edge:secret"},
		{desktopIdleKey, "wb:deadlines:desktop_idle"},
		{desktopWorkKey, "wb:{desktops}:work"},
		{desktopWorkerKey, "wb:{desktops}:worker"},
		{snapshotWorkKey, "wb:{snapshots}:work"},
		{snapshotWorkerKey, "wb:{snapshots}:worker"},
		{runWorkKey, "wb:{runs}:work"},
		{runWorkerKey, "wb:{runs}:worker"},
		{first(workShardKeys("runs", 0)), "wb:{runs.0}:work"},
		{second(workShardKeys("runs", 15)), "wb:{runs.15}:worker"},
		{first(workShardKeys("runs", workShard("run_1"))), "wb:{runs.10}:work"},
		{first(workShardKeys("runs", workShard("run_01HZX3K4Q2"))), "wb:{runs.11}:work"},
		{runLeases.shard("run_1").holders, "wb:{runs.10}:worker"},
		{desktopLeaseSet(true).shard("desk_1").ends, "wb:{desktops.12}:work"},
		{snapshotLeaseSet(true).shard("sess_1").holders, "wb:{snapshots.15}:worker"},
		{k.desktop("desk_1"), "wb:{proj_1}:d:desk_1"},
		{k.desktops(), "wb:{proj_1}:desktops"},
		{NodesDrainingKey, "wb:nodes:draining"},
		{nodeSessionsKey("node_1"), "wb:node:{node_1}:sessions"},
		{nodeClaimsKey("node_1"), "wb:node:{node_1}:claims"},
		{nodeRoomKey("node_1"), "wb:node:{node_1}:room"},
		{certFilesKey, "wb:{tls}:files"},
		{certModifiedKey, "wb:{tls}:modified"},
		{certIndexKey, "wb:{tls}:index"},
		{certLockKey("issue_cert_example.com"), "wb:{tls}:lock:issue_cert_example.com"},
		{signalKey(WorkOutbox), "wb:signal:outbox"},
		{signalKey(WorkUsage), "wb:signal:usage"},
		{signalKey(WorkPending), "wb:signal:pending"},
		{pendingSignalKey, "wb:signal:pending"},
		{outboxSignalKey, "wb:signal:outbox"},
		{apiKeyHashKey(apiKeyHash("wb_live_x")), "wb:apikey:86ca7c1f629888376e30816f516d17969a1f44564688bf4d07b321bb0614fb41"},
		{k.apiKeys(), "wb:{proj_1}:apikeys"},
		{ChangesChannel, "wb:changes"},
		{changeAckKey("chg_1"), "wb:changes:ack:chg_1"},
		{k.session("sess_1"), "wb:{proj_1}:s:sess_1"},
		{k.SessionHash("sess_1"), "wb:{proj_1}:s:sess_1"},
		{k.all(), "wb:{proj_1}:all"},
		{k.byState(session.Running), "wb:{proj_1}:st:running"},
		{k.byEndUser("eu_1"), "wb:{proj_1}:eu:eu_1"},
		{k.active(), "wb:{proj_1}:active"},
		{k.reservations(), "wb:{proj_1}:reservations"},
		{k.reservationHolders(), "wb:{proj_1}:reservations:holders"},
		{k.Outbox(), "wb:{proj_1}:outbox"},
		{Outbox("proj_1"), "wb:{proj_1}:outbox"},
		{k.placing(), "wb:{proj_1}:placing"},
		{k.placeAgain(), "wb:{proj_1}:placing:again"},
		{k.settling(), "wb:{proj_1}:settling"},
		{k.settleAgain(), "wb:{proj_1}:settling:again"},
		{k.project(), "wb:{proj_1}:project"},
		{k.objects(KindSnapshot), "wb:{proj_1}:obj:snapshot"},
		{k.objIndex(KindSnapshot), "wb:{proj_1}:idx:snapshot"},
		{k.objects(legacyKindRun), "wb:{proj_1}:obj:run"},
		{k.objIndex(legacyKindRun), "wb:{proj_1}:idx:run"},
		{legacyRunsMovedKey, "wb:migrated:runs"},
		{k.run("run_1"), "wb:{proj_1}:run:run_1"},
		{k.kept(), "wb:{proj_1}:kept"},
		{k.keptExpiry(), "wb:{proj_1}:kept:exp"},
		{k.keptSizes(), "wb:{proj_1}:kept:size"},
		{k.keptStubs(), "wb:{proj_1}:kept:stub"},
		{k.idempotency("key-1"), "wb:{proj_1}:idem:be2974546978e3739e6d6da85c4be9f334ce32df2b9fd4b6ff1b55c0d57e9d44"},
		{k.idempotencyLease("key-1"), "wb:{proj_1}:idem:be2974546978e3739e6d6da85c4be9f334ce32df2b9fd4b6ff1b55c0d57e9d44:lease"},
		{k.Limits(), "wb:{proj_1}:limits"},
		{k.CapFlag("hard", "202603"), "wb:{proj_1}:capped:hard:202603"},
		{k.EndUserCapFlag("eu_1", "soft", "202603"), "wb:{proj_1}:capped:soft:eu:eu_1:202603"},
		{k.CappedEndUsers("202603"), "wb:{proj_1}:capped:eus:202603"},
		{k.CapSoftDeny("202603"), "wb:{proj_1}:capped:softdeny:202603"},
		{k.EndUserCapSoftDeny("eu_1", "202603"), "wb:{proj_1}:capped:softdeny:eu:eu_1:202603"},
		{k.CapStops(), "wb:{proj_1}:capped:stops"},
		{k.CapUndecided(), "wb:{proj_1}:capped:undecided"},
		{k.RateBucket(), "wb:{proj_1}:rl"},
		{k.UsageStream(), "wb:{proj_1}:usage"},
		{k.UsageSeq(), "wb:{proj_1}:usage:seq"},
		{k.Spend(), "wb:{proj_1}:spend"},
		{k.SpendHours(), "wb:{proj_1}:spend:hours"},
		{k.UsageSeqAt(), "wb:{proj_1}:usage:seq:at"},
		{k.Indexed(), "wb:{proj_1}:usage:indexed"},
		{k.UsageHour(hour), "wb:{proj_1}:usage:h:2026030404"},
		{k.SnapshotAccrual(), "wb:{proj_1}:snapacc"},
		{k.Policies().Latest(), "wb:{proj_1}:pol:latest"},
		{k.Policies().Versions("base"), "wb:{proj_1}:pol:v:base"},
		{k.Policies().Decisions(), "wb:{proj_1}:decisions"},
		{k.Webhooks().Endpoints(), "wb:{proj_1}:wh:endpoints"},
		{k.Webhooks().Log("ep_1"), "wb:{proj_1}:wh:log:ep_1"},
		{k.Webhooks().Due(), "wb:{proj_1}:wh:due"},
		{k.Webhooks().Queue("ep_1/sess_1"), "wb:{proj_1}:wh:q:ep_1/sess_1"},
		{k.Webhooks().QueueMeta("ep_1/sess_1"), "wb:{proj_1}:wh:qm:ep_1/sess_1"},
		{k.Webhooks().QueuedBytes(), "wb:{proj_1}:wh:queued"},
		{k.Webhooks().Owner(), "wb:{proj_1}:wh:owner"},
		{k.Webhooks().Again(), "wb:{proj_1}:wh:again"},
		{k.Plugins().Meta(), "wb:{proj_1}:plugin:meta"},
		{k.Plugins().Wasm("sha256:abcd"), "wb:{proj_1}:plugin:wasm:abcd"},
		{k.Plugins().Wasm("abcd"), "wb:{proj_1}:plugin:wasm:abcd"},
		{k.Plugins().Limits(), "wb:{proj_1}:plugin:limits"},
		{k.Plugins().Version(), "wb:{proj_1}:plugin:ver"},
	} {
		if c.got != c.want {
			t.Errorf("key %q, want %q", c.got, c.want)
		}
	}
}

func first(a, _ string) string  { return a }
func second(_, b string) string { return b }

// TestNoKeysOutsideStore: keys.go is the one place that names a key; any other package that
// spells one out by hand would drift from it unnoticed.
func TestNoKeysOutsideStore(t *testing.T) {
	t.Parallel()
	key := regexp.MustCompile(`"wb:[a-z{]`)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (filepath.Base(path) == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if rel, _ := filepath.Rel(root, path); filepath.Dir(rel) == "store" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if key.MatchString(line) {
				t.Errorf("%s:%d names a Redis key by hand; add it to store/keys.go: %s", path, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
