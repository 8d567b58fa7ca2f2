package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"wb/hypervisor/templates"
	"wb/node"
	"wb/session"
)

// TestProvisionBeforeRun: `wb node` serves its API while Run starts (cmd/wb runNode starts
// both at once), so a provision can arrive before Run has set the node's context. Run writes
// Node.ctx and apiProvision's goroutine reads it with nothing ordering the two: under -race this
// test reports the data race. (Not parallel, so that a report is charged to this test alone.)
func TestProvisionBeforeRun(t *testing.T) {
	const project = "proj_early"
	st, _ := newStore(t)
	d := newDriver(t, "runsc", tempDir(t))
	cfg := nodeConfig(t, st, d, tempDir(t), "node_early")
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(n.Handler("tok"))
	defer srv.Close()
	// A session that fails fast (a foreign template digest): no guest is started.
	s := placed(t, st, project, cfg.Info.ID, sessionOpts{idleS: 30, lifeS: 60,
		template: templates.Base + "@sha256:0000000000000000000000000000000000000000000000000000000000000000"})
	body, _ := json.Marshal(s)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/provision", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 {
		t.Fatalf("provision: %s", resp.Status)
	}
	end, _ := waitState(t, st, project, s.ID, 30*time.Second, session.Failed, session.Running)
	checkEnded(t, end, session.Failed, session.StartFailure)
}
