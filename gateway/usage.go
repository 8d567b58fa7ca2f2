package gateway

import (
	"net/http"
	"time"

	"wb/store"
)

func (s *Server) limits(r *http.Request, p store.Project) (Limits, error) {
	l, err := s.Accounts.Limits(r.Context(), p.ID)
	if err != nil {
		return Limits{}, err
	}
	spend, err := s.Accounts.Spend(r.Context(), p.ID, "", s.Now())
	if err != nil {
		return Limits{}, err
	}
	return Limits{Object: "limits", MonthlySpendCapMicroUSD: l.MonthlySpendCapMicroUSD,
		EndUserMonthlySpendCapMicroUSD: l.EndUserMonthlySpendCapMicroUSD, Plan: p.Plan,
		SpendThisMonthMicroUSD: spend, PlanLimits: p.Granted}, nil
}

func (s *Server) getLimits(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := s.limits(r, p)
	if err != nil {
		return err
	}
	writeJSON(w, 200, body)
	return nil
}

// putLimits sets the spend caps and lowers plan limits. Fields left out keep their value;
// raising a plan limit above the plan is 403 plan_limit, and nothing changes; raising a cap
// above this month's spend lifts the admission stop (the end-user cap: of each end user
// whose spend this month it is now above).
func (s *Server) putLimits(w http.ResponseWriter, r *http.Request, p store.Project) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	var req struct {
		MonthlySpendCapMicroUSD        *int64 `json:"monthly_spend_cap_micro_usd"`
		EndUserMonthlySpendCapMicroUSD *int64 `json:"end_user_monthly_spend_cap_micro_usd"`
		store.PlanChange
	}
	if err := decodeStrict(b, &req); err != nil {
		return err
	}
	ctx := r.Context()
	cur, err := s.Accounts.Limits(ctx, p.ID)
	if err != nil {
		return err
	}
	if req.MonthlySpendCapMicroUSD != nil {
		cur.MonthlySpendCapMicroUSD = *req.MonthlySpendCapMicroUSD
	}
	if req.EndUserMonthlySpendCapMicroUSD != nil {
		cur.EndUserMonthlySpendCapMicroUSD = *req.EndUserMonthlySpendCapMicroUSD
	}
	if err := cur.Validate(); err != nil {
		return err
	}
	if req.PlanChange != (store.PlanChange{}) {
		if err := s.Store.LowerLimits(ctx, p.ID, req.PlanChange); err != nil {
			return err
		}
		if p, err = s.Store.GetProject(ctx, p.ID); err != nil {
			return err
		}
		s.auth.forget(p.ID) // every gateway's is dropped before LowerLimits returns; this one's in any case
	}
	if err := s.Accounts.SetLimits(ctx, p.ID, cur); err != nil {
		return err
	}
	// Uncap reads the spend and lifts the flags in one step: a record settled between the two
	// could take the project past the raised cap while its flag kept Caps from flagging it.
	if err := s.Accounts.Uncap(ctx, p.ID, cur.MonthlySpendCapMicroUSD, s.Now()); err != nil {
		return err
	}
	if req.EndUserMonthlySpendCapMicroUSD != nil {
		if err := s.Accounts.UncapEndUsers(ctx, p.ID, cur.EndUserMonthlySpendCapMicroUSD, s.Now()); err != nil {
			return err
		}
	}
	body, err := s.limits(r, p)
	if err != nil {
		return err
	}
	writeJSON(w, 200, body)
	return nil
}

// usage serves GET /v1/usage?from=&to=&group_by=session|end_user (default: this month so far,
// by session).
func (s *Server) usage(w http.ResponseWriter, r *http.Request, p store.Project) error {
	q := r.URL.Query()
	now := s.Now().UTC()
	from := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	to := now.Add(time.Hour).Truncate(time.Hour)
	for _, f := range []struct {
		name string
		out  *time.Time
	}{{"from", &from}, {"to", &to}} {
		if v := q.Get(f.name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return errInvalid(f.name, "must be an RFC 3339 time, got %q", v)
			}
			*f.out = t
		}
	}
	groupBy := q.Get("group_by")
	if groupBy == "" {
		groupBy = "session"
	}
	rep, err := s.Accounts.Report(r.Context(), p.ID, from, to, groupBy)
	if err != nil {
		return err
	}
	writeJSON(w, 200, rep)
	return nil
}
