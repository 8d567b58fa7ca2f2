package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"wb/node"
	"wb/plugins"
	"wb/policies"
	"wb/quota"
	"wb/session"
)

// decisionPoints starts the Rego engine and the Wasm plugin host shared by admission, the
// nodes' runtime checks and spend caps.
func decisionPoints(ctx context.Context, rdb redis.UniversalClient, dataDir string, reg prometheus.Registerer, log *slog.Logger) (*policies.Engine, *plugins.Host, error) {
	pol, err := policies.New(ctx, rdb, policies.Options{Logger: log, Metrics: reg})
	if err != nil {
		return nil, nil, err
	}
	host, err := plugins.NewHost(ctx, rdb, plugins.Options{CacheDir: filepath.Join(dataDir, "wasm-cache"), Logger: log})
	if err != nil {
		_ = pol.Close(ctx)
		return nil, nil, err
	}
	return pol, host, nil
}

// runtimeChecker is the runtime decision point: the platform's rules and the session's pinned
// policy, then the project's runtime plugins; any kill wins. The platform's kill always
// stands; a project policy or plugin that cannot answer refuses the event (Deny) without
// killing the session. An error means the platform's own rules could not decide: the node
// refuses the event then too.
type runtimeChecker struct {
	pol  *policies.Engine
	plug *plugins.Host
}

func (c runtimeChecker) Check(ctx context.Context, s node.RuntimeSession, event map[string]any) (node.Verdict, error) {
	d, err := c.pol.Runtime(ctx, s.Project, s.PolicyID, event)
	if err != nil {
		return node.Verdict{}, err
	}
	if d.Kill {
		return node.Verdict{Kill: true, Rule: d.Rule}, nil
	}
	if d.Deny {
		return node.Verdict{Deny: true, Reason: d.DenyReason}, nil
	}
	typ, _ := event["type"].(string)
	sess := &session.Session{ID: s.ID, Object: session.ObjectName, ProjectID: s.Project, Tier: s.Tier}
	if s.EndUserID != "" {
		sess.EndUserID = &s.EndUserID
	}
	if s.PolicyID != "" {
		sess.PolicyID = &s.PolicyID
	}
	now := time.Now()
	in, err := plugins.Runtime(s.Project, sess, plugins.RuntimeEvent{Type: typ, AtMs: now.UnixMilli(), Data: event}, now).Marshal()
	if err != nil {
		return node.Verdict{Deny: true, Reason: "the runtime plugins' input: " + err.Error()}, nil
	}
	ds, err := c.plug.Decide(ctx, s.Project, "runtime", in)
	if err != nil {
		return node.Verdict{Deny: true, Reason: "runtime plugins: " + err.Error()}, nil
	}
	for _, pd := range ds {
		if !pd.Allow {
			return node.Verdict{Kill: true, Rule: pd.Decider}, nil
		}
	}
	return node.Verdict{AllowEgress: d.AllowEgress}, nil
}

// spendDecider is the spend decision point: the platform's and the project's spend policies,
// then the project's spend plugins, any of which can deny (stop the sessions in scope and
// new admissions) with its reasons.
func spendDecider(pol *policies.Engine, plug *plugins.Host) func(context.Context, quota.CapEvent) (quota.SpendDecision, error) {
	return func(ctx context.Context, ev quota.CapEvent) (quota.SpendDecision, error) {
		in := map[string]any{"plan": map[string]any{}, "end_user_id": ev.EndUser, "caps": map[string]any{}}
		caps := in["caps"].(map[string]any)
		if ev.Scope == "project" {
			in["project_spend_micro_usd"] = ev.SpendMicroUSD
			caps["monthly_spend_cap_micro_usd"] = ev.CapMicroUSD
		} else {
			in["end_user_spend_micro_usd"] = ev.SpendMicroUSD
			caps["end_user_monthly_spend_cap_micro_usd"] = ev.CapMicroUSD
		}
		d, err := pol.Spend(ctx, ev.Project, in)
		if err != nil {
			return quota.SpendDecision{}, err
		}
		out := quota.SpendDecision{Warnings: d.Warnings}
		if ev.Level == "hard" {
			out.Stop, out.DenyAdmission = d.StopScope != "", d.DenyAdmission
		}
		raw, err := plugins.SpendInput(ev.Project, nil, plugins.Spend{Scope: ev.Scope, EndUserID: ev.EndUser, Level: ev.Level,
			SpendMicroUSD: ev.SpendMicroUSD, CapMicroUSD: ev.CapMicroUSD, Month: ev.Month}, time.Now()).Marshal()
		if err != nil {
			return out, err
		}
		ds, err := plug.Decide(ctx, ev.Project, "spend", raw)
		if err != nil {
			return out, err
		}
		for _, pd := range ds {
			out.Warnings = append(out.Warnings, pd.Warnings...)
			if !pd.Allow {
				out.Stop, out.DenyAdmission = true, true
				out.Warnings = append(out.Warnings, pd.Reasons...)
			}
		}
		return out, nil
	}
}
