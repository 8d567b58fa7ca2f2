package decide

import (
	"context"
	"log/slog"
	"time"

	"wb/policies"
	"wb/session"
)

// Policies is the Rego engine (*policies.Engine): the platform's shipped policies and the
// project's, each in its mode.
type Policies interface {
	Admit(ctx context.Context, in session.AdmissionInput) (session.Decision, error)
	Runtime(ctx context.Context, project, policyID string, input map[string]any) (policies.RuntimeDecision, error)
	Spend(ctx context.Context, project string, input map[string]any) (policies.SpendDecision, error)
}

// Plugins is the Wasm plugin host (*plugins.Host): one decision per plugin of the project at
// point, in order; an error only for the host's own failures.
type Plugins interface {
	Decide(ctx context.Context, project, point string, input []byte) ([]session.Decision, error)
}

// Decider composes the Rego policies and the Wasm plugins at the three decision points. Either
// evaluator may be nil (none). The zero Decider allows every create and event and applies only
// the platform's spend floor.
type Decider struct {
	Policies Policies
	Plugins  Plugins
	Now      func() time.Time // the time the plugins' inputs carry; nil: time.Now
	Logger   *slog.Logger     // nil: slog.Default()
}

var _ session.Admitter = Decider{}

func (d Decider) now() time.Time {
	if d.Now != nil {
		return d.Now()
	}
	return time.Now()
}

func (d Decider) log() *slog.Logger {
	if d.Logger != nil {
		return d.Logger
	}
	return slog.Default()
}
