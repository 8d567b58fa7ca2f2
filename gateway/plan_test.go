package gateway

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/session"
	"wb/store"
)

// TestTenantCannotRaisePlan: the attack is a tenant giving itself 100000 sessions. Every plan
// limit is the operator's; PUT /v1/limits may only lower one, and raising any is 403 with a
// message naming the field and the plan's value.
func TestTenantCannotRaisePlan(t *testing.T) {
	e := newEnv(t)
	msg := expectError(t, e.do("PUT", "/v1/limits", e.key, map[string]any{"concurrency": 100000}), 403, "plan_limit", "concurrency")
	if !strings.Contains(msg, "concurrency") || !strings.Contains(msg, "plan's 100") {
		t.Fatalf("the 403 does not name the field and the plan value: %s", msg)
	}
	def := store.DefaultPlan()
	for field, plan := range map[string]int{"rate_per_sec": def.RatePerSec, "burst": def.Burst,
		"snapshot_count": def.SnapshotCount, "snapshot_gib": def.SnapshotGiB, "node_share_pct": def.NodeSharePct} {
		if field == "node_share_pct" && plan == 100 {
			continue
		}
		expectError(t, e.do("PUT", "/v1/limits", e.key, map[string]any{field: plan + 1}), 403, "plan_limit", field)
	}
	// A refused request changes nothing, not even the spend cap it carried.
	expectError(t, e.do("PUT", "/v1/limits", e.key, map[string]any{"monthly_spend_cap_micro_usd": 5, "concurrency": 101}), 403, "plan_limit", "concurrency")
	var l Limits
	e.mustDo("GET", "/v1/limits", e.key, nil, 200, &l)
	if l.Concurrency != 100 || l.MonthlySpendCapMicroUSD != 0 || l.PlanLimits != def || l.Plan != def {
		t.Fatalf("after refusals: %+v", l)
	}

	// Lowering is the tenant's; the limit in force follows.
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"concurrency": 1, "snapshot_count": 3}, 200, &l)
	if l.Concurrency != 1 || l.SnapshotCount != 3 || l.PlanLimits.Concurrency != 100 {
		t.Fatalf("lowered: %+v", l)
	}
	e.create(e.key, map[string]any{"tier": 2})
	expectError(t, e.do("POST", "/v1/sessions", e.key, map[string]any{"tier": 2}), 429, "concurrency_limit", "")

	// The operator's route needs the admin key, not a project's.
	expectError(t, e.do("PUT", "/v1/admin/projects/"+e.projA+"/plan", e.key, map[string]any{"concurrency": 100000}), 401, "unauthenticated", "")
	expectError(t, e.do("GET", "/v1/admin/projects/"+e.projA+"/plan", e.key, nil), 401, "unauthenticated", "")
	var plan struct {
		Object    string `json:"object"`
		ProjectID string `json:"project_id"`
		store.Plan
	}
	e.mustDo("PUT", "/v1/admin/projects/"+e.projA+"/plan", adminKey, map[string]any{"concurrency": 100000, "node_share_pct": 100}, 200, &plan)
	if plan.Object != "plan" || plan.ProjectID != e.projA || plan.Concurrency != 100000 || plan.NodeSharePct != 100 || plan.RatePerSec != def.RatePerSec {
		t.Fatalf("plan %+v", plan)
	}
	e.mustDo("GET", "/v1/admin/projects/"+e.projA+"/plan", adminKey, nil, 200, &plan)
	if plan.Concurrency != 100000 {
		t.Fatalf("plan read back %+v", plan)
	}
	// The tenant's own lower value stays in force under the bigger plan until it raises it.
	e.mustDo("GET", "/v1/limits", e.key, nil, 200, &l)
	if l.Concurrency != 1 || l.PlanLimits.Concurrency != 100000 {
		t.Fatalf("after the plan grew: %+v", l)
	}
	e.mustDo("PUT", "/v1/limits", e.key, map[string]any{"concurrency": 100000}, 200, &l)
	if l.Concurrency != 100000 {
		t.Fatalf("raised within the plan: %+v", l)
	}
	e.create(e.key, map[string]any{"tier": 2})

	expectError(t, e.do("PUT", "/v1/admin/projects/proj_nope/plan", adminKey, map[string]any{"concurrency": 1}), 404, "not_found", "")
	expectError(t, e.do("GET", "/v1/admin/projects/proj_nope/plan", adminKey, nil), 404, "not_found", "")
	expectError(t, e.do("PUT", "/v1/admin/projects/"+e.projA+"/plan", adminKey, map[string]any{"node_share_pct": 0}), 400, "invalid_request", "node_share_pct")
	expectError(t, e.do("PUT", "/v1/admin/projects/"+e.projA+"/plan", adminKey, map[string]any{"monthly_spend_cap_micro_usd": 1}), 400, "invalid_request", "monthly_spend_cap_micro_usd")
	// Another project's plan is untouched.
	_, keyB := e.newProject("B", nil)
	e.mustDo("GET", "/v1/limits", keyB, nil, 200, &l)
	if l.Plan != def {
		t.Fatalf("B's limits changed: %+v", l)
	}
}

// TestSnapshotPlan: snapshots past the plan's count or bytes are refused with 403 plan_limit,
// the session keeps running, and a snapshot found too big once taken leaves no files.
func TestSnapshotPlan(t *testing.T) {
	e := newEnv(t)
	s := e.running(map[string]any{"tier": 2})
	snapPath := "/v1/sessions/" + s.ID + ":snapshot"
	e.mustDo("PUT", "/v1/admin/projects/"+e.projA+"/plan", adminKey, map[string]any{"snapshot_count": 1}, 200, nil)
	var snap session.Snapshot
	e.mustDo("POST", snapPath, e.key, nil, 201, &snap)
	msg := expectError(t, e.do("POST", snapPath, e.key, nil), 403, "plan_limit", "snapshot_count")
	if !strings.Contains(msg, "DELETE /v1/snapshots/") {
		t.Fatalf("the refusal does not say what to do: %s", msg)
	}
	e.waitState(e.key, s.ID, session.Running)
	e.mustDo("DELETE", "/v1/snapshots/"+snap.ID, e.key, nil, 200, nil)

	// Bytes: a snapshot that crosses the plan's GiB once taken is refused and its files go.
	e.mustDo("PUT", "/v1/admin/projects/"+e.projA+"/plan", adminKey, map[string]any{"snapshot_count": 10, "snapshot_gib": 1}, 200, nil)
	e.node.SetSnapshotBytes(2 << 30)
	expectError(t, e.do("POST", snapPath, e.key, nil), 403, "plan_limit", "snapshot_gib")
	if got := e.waitState(e.key, s.ID, session.Running); got.State != session.Running {
		t.Fatal("session not running after a refused snapshot")
	}
	var list struct{ Data []session.Snapshot }
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	if len(list.Data) != 0 {
		t.Fatalf("a refused snapshot was kept: %+v", list.Data)
	}
	deletes := slices.DeleteFunc(e.node.Calls(), func(c string) bool { return !strings.HasPrefix(c, "delete_snapshot:") })
	if len(deletes) != 2 { // the one deleted above, and the refused one
		t.Fatalf("node deletions %v", deletes)
	}
	// A plan of 0 GiB refuses before any work.
	e.mustDo("PUT", "/v1/admin/projects/"+e.projA+"/plan", adminKey, map[string]any{"snapshot_gib": 0}, 200, nil)
	before := len(e.node.Calls())
	expectError(t, e.do("POST", snapPath, e.key, nil), 403, "plan_limit", "snapshot_gib")
	if len(e.node.Calls()) != before {
		t.Fatalf("the node was asked for a snapshot the plan refuses: %v", e.node.Calls()[before:])
	}
}

// TestSnapshotPlanConcurrent: snapshots of several sessions taken at once, each passing the
// check made before the work, cannot pass the plan's count together.
func TestSnapshotPlanConcurrent(t *testing.T) {
	e := newEnv(t)
	const n = 5
	var ids []string
	for range n {
		ids = append(ids, e.running(map[string]any{"tier": 2}).ID)
	}
	e.mustDo("PUT", "/v1/admin/projects/"+e.projA+"/plan", adminKey, map[string]any{"snapshot_count": 1}, 200, nil)
	e.node.SetSnapshotDelay(300 * time.Millisecond)
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { codes[i] = e.do("POST", "/v1/sessions/"+id+":snapshot", e.key, nil).status })
	}
	wg.Wait()
	slices.Sort(codes)
	if want := []int{201, 403, 403, 403, 403}; !slices.Equal(codes, want) {
		t.Fatalf("answers %v; want %v", codes, want)
	}
	var list struct{ Data []session.Snapshot }
	e.mustDo("GET", "/v1/snapshots", e.key, nil, 200, &list)
	if len(list.Data) != 1 {
		t.Fatalf("%d snapshots kept; the plan allows 1", len(list.Data))
	}
	for _, id := range ids {
		e.waitState(e.key, id, session.Running)
	}
}
