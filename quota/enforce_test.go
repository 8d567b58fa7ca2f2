package quota

import (
	"context"
	"fmt"
	"testing"

	"wb/internal/redistest"
	"wb/store"
)

// A crossed hard cap stops admissions unless the spend decision lets them go on; then the
// enforcer lifts the stop through Accounts.
func TestEnforcerAdmissionStop(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Server(t)
	st := store.New(rdb)
	accounts := NewAccounts(rdb)
	month := monthOf(t0)
	for i, c := range []struct {
		name      string
		endUser   string
		decide    func(context.Context, CapEvent) (SpendDecision, error)
		wantScope string // the scope whose cap stops admissions afterwards
	}{
		{name: "default", wantScope: "project"},
		{name: "default for an end user", endUser: "eu_1", wantScope: "end_user"},
		{name: "decision keeps admissions", decide: keepAdmissions},
		{name: "decision keeps an end user's admissions", endUser: "eu_1", decide: keepAdmissions},
	} {
		t.Run(c.name, func(t *testing.T) {
			project := fmt.Sprintf("proj_%d", i)
			if _, err := st.EnsureProject(ctx, project, project); err != nil {
				t.Fatal(err)
			}
			// What Caps does when the cap is crossed: set the flag, then call the enforcer.
			caps := NewCaps(rdb, nil, nil)
			ev := CapEvent{Project: project, EndUser: c.endUser, Scope: "project", SpendMicroUSD: 2000, CapMicroUSD: 1000, Month: month}
			if c.endUser != "" {
				ev.Scope = "end_user"
			}
			caps.check(ctx, ev)
			ev.Level = "hard"
			e := &Enforcer{Store: st, Accounts: accounts, Decide: c.decide}
			e.OnCap(ctx, ev)
			scope, _, err := accounts.CapState(ctx, project, c.endUser, t0)
			if err != nil {
				t.Fatal(err)
			}
			if scope != c.wantScope {
				t.Fatalf("admissions stopped by the %q cap, want %q", scope, c.wantScope)
			}
		})
	}
}

func keepAdmissions(context.Context, CapEvent) (SpendDecision, error) {
	return SpendDecision{Warnings: []string{"let them through"}}, nil
}
