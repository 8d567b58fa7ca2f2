//go:build linux

package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"wb/decide"
	"wb/node"
	"wb/plugins"
	"wb/policies"
	"wb/quota"
	"wb/session"
)

// decisionPoints starts the Rego engine and the Wasm plugin host shared by admission, the
// nodes' runtime checks and spend caps.
func decisionPoints(ctx context.Context, rdb redis.UniversalClient, dataDir string, pluginTimeout time.Duration, reg prometheus.Registerer, log *slog.Logger) (*policies.Engine, *plugins.Host, error) {
	pol, err := policies.New(ctx, rdb, policies.Options{Logger: log, Metrics: reg})
	if err != nil {
		return nil, nil, err
	}
	host, err := plugins.NewHost(ctx, rdb, plugins.Options{CacheDir: filepath.Join(dataDir, "wasm-cache"), Timeout: pluginTimeout, Logger: log})
	if err != nil {
		_ = pol.Close(ctx)
		return nil, nil, err
	}
	return pol, host, nil
}

// runtimeChecker wires the node's runtime decision point to decide.Decider.Runtime, which owns
// the composition and its failure mode (package decide's doc).
type runtimeChecker struct {
	pol  *policies.Engine
	plug *plugins.Host
	log  *slog.Logger
}

func (c runtimeChecker) Check(ctx context.Context, s node.RuntimeSession, event session.GuestEvent) (node.Verdict, error) {
	d := decide.Decider{Policies: c.pol, Plugins: c.plug, Logger: c.log}
	v, err := d.Runtime(ctx, decide.RuntimeInput{
		Session: decide.Session{ID: s.ID, Project: s.Project, PolicyID: s.PolicyID, EndUserID: s.EndUserID, Tier: s.Tier},
		Event:   event,
	})
	if err != nil {
		return node.Verdict{}, err
	}
	if len(v.Warnings) > 0 {
		c.log.WarnContext(ctx, "runtime decision warnings", "project", s.Project, "session", s.ID, "event", event.Type, "warnings", v.Warnings)
	}
	return node.Verdict{Kill: v.Kill, Rule: v.Rule, AllowEgress: v.AllowEgress, Deny: v.Refuse, Reason: v.Reason}, nil
}

// spendDecider wires quota's enforcer to decide.Decider.Spend. The enforcer stops the
// sessions of the scope the decision names: the crossed cap's, or the whole project when a
// decider widens an end user's cap to it.
func spendDecider(pol *policies.Engine, plug *plugins.Host, log *slog.Logger) func(context.Context, quota.CapEvent) (quota.SpendDecision, error) {
	d := decide.Decider{Policies: pol, Plugins: plug, Logger: log}
	return func(ctx context.Context, ev quota.CapEvent) (quota.SpendDecision, error) {
		scope, err := decide.ParseScope(ev.Scope)
		if err != nil {
			return quota.SpendDecision{}, err
		}
		level, err := decide.ParseLevel(ev.Level)
		if err != nil {
			return quota.SpendDecision{}, err
		}
		out := d.Spend(ctx, decide.SpendInput{Project: ev.Project, Scope: scope, EndUserID: ev.EndUser, Level: level,
			SpendMicroUSD: ev.SpendMicroUSD, CapMicroUSD: ev.CapMicroUSD, Month: ev.Month})
		return quota.SpendDecision{Stop: out.Stop != decide.ScopeNone, StopProject: out.Stop == decide.ScopeProject,
			DenyAdmission: out.DenyAdmission, Warnings: out.Warnings}, nil
	}
}
