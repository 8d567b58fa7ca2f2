package decide

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"wb/policies"
	"wb/session"
)

// fakePolicies answers what the test sets and records the inputs it was given.
type fakePolicies struct {
	admit    session.Decision
	runtime  policies.RuntimeDecision
	spend    policies.SpendDecision
	err      error
	mu       sync.Mutex
	inputs   []map[string]any
	policyID string
}

func (f *fakePolicies) Admit(context.Context, session.AdmissionInput) (session.Decision, error) {
	return f.admit, f.err
}

func (f *fakePolicies) Runtime(_ context.Context, _, policyID string, in map[string]any) (policies.RuntimeDecision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inputs, f.policyID = append(f.inputs, in), policyID
	return f.runtime, f.err
}

func (f *fakePolicies) Spend(_ context.Context, _ string, in map[string]any) (policies.SpendDecision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inputs = append(f.inputs, in)
	return f.spend, f.err
}

// fakePlugins answers decisions (and err) at every point and records the inputs.
type fakePlugins struct {
	decisions []session.Decision
	err       error
	mu        sync.Mutex
	inputs    []map[string]any
}

func (f *fakePlugins) Decide(_ context.Context, _, point string, input []byte) ([]session.Decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var m map[string]any
	if err := json.Unmarshal(input, &m); err != nil {
		return nil, err
	}
	m["_point"] = point
	f.inputs = append(f.inputs, m)
	return f.decisions, f.err
}

func (f *fakePlugins) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.inputs)
}

// clock is a fixed time for the plugins' at_ms.
var clock = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func fixed() time.Time { return clock }

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
