// Package client is the control plane's side of the node API: it provisions sessions on
// nodes (placer.Provisioner) and reaches their guests (gateway.Guests), finding each
// session's node through the registrations in Redis.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"wb/agent"
	"wb/session"
	"wb/store"
)

// Client talks to every node with one shared token. Safe for concurrent use.
type Client struct {
	st    *store.Store
	hc    *http.Client
	token string

	mu      sync.Mutex
	addrs   map[string]string    // node id → base URL
	fetched time.Time            // when addrs was last read
	touched map[string]time.Time // session → last touch sent
}

// New returns a client of the nodes registered in st.
func New(st *store.Store, token string) *Client {
	return &Client{st: st, token: token, addrs: map[string]string{}, touched: map[string]time.Time{},
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 60 * time.Second}}}
}

// addr answers the base URL of a node, reading the registrations again when it is unknown.
func (c *Client) addr(ctx context.Context, nodeID string) (string, error) {
	c.mu.Lock()
	a, ok := c.addrs[nodeID]
	stale := time.Since(c.fetched) > time.Second
	c.mu.Unlock()
	if ok {
		return a, nil
	}
	if stale {
		nodes, err := c.st.Nodes(ctx)
		if err != nil {
			return "", err
		}
		c.mu.Lock()
		c.fetched = time.Now()
		for _, n := range nodes {
			c.addrs[n.ID] = n.Addr
		}
		a, ok = c.addrs[nodeID]
		c.mu.Unlock()
	}
	if !ok {
		return "", fmt.Errorf("node %q is not registered", nodeID)
	}
	return a, nil
}

func (c *Client) call(ctx context.Context, nodeID, method, path string, in, out any) error {
	base, err := c.addr(ctx, nodeID)
	if err != nil {
		return err
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("node %s: %w", nodeID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			return fmt.Errorf("node %s: %s", nodeID, e.Error.Message)
		}
		return fmt.Errorf("node %s: %s", nodeID, resp.Status)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// Provision asks the node to start the session's guest.
func (c *Client) Provision(ctx context.Context, n store.NodeInfo, s *session.Session) error {
	c.mu.Lock()
	c.addrs[n.ID] = n.Addr
	c.mu.Unlock()
	return c.call(ctx, n.ID, "POST", "/v1/provision", s, nil)
}

// Agent answers a client of the session's agent, through its node's proxy.
func (c *Client) Agent(ctx context.Context, s *session.Session) (*agent.Client, error) {
	base, err := c.addr(ctx, s.NodeID)
	if err != nil {
		return nil, err
	}
	return agent.NewHTTPClient(c.hc, base+"/v1/sessions/"+s.ID+"/agent", c.token), nil
}

// Exec runs a command in the session's guest.
func (c *Client) Exec(ctx context.Context, s *session.Session, req session.ExecRequest, _ []string, out func(session.ExecChunk) error) (session.ExecResult, error) {
	a, err := c.Agent(ctx, s)
	if err != nil {
		return session.ExecResult{}, err
	}
	areq, err := agent.ExecRequestFrom(&req)
	if err != nil {
		return session.ExecResult{}, err
	}
	return a.Exec(ctx, areq, out)
}

// Touch records activity, at most once a second per session.
func (c *Client) Touch(s *session.Session) {
	c.mu.Lock()
	last := c.touched[s.ID]
	now := time.Now()
	if now.Sub(last) < time.Second {
		c.mu.Unlock()
		return
	}
	c.touched[s.ID] = now
	if len(c.touched) > 100000 {
		clear(c.touched)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = c.call(ctx, s.NodeID, "POST", "/v1/sessions/"+s.ID+":touch", nil, nil)
}

// Retime hands the node new timers.
func (c *Client) Retime(ctx context.Context, s *session.Session) {
	_ = c.call(ctx, s.NodeID, "POST", "/v1/sessions/"+s.ID+":retime", s, nil)
}

// Pause freezes the guest.
func (c *Client) Pause(ctx context.Context, s *session.Session) error {
	return c.call(ctx, s.NodeID, "POST", "/v1/sessions/"+s.ID+":pause", nil, nil)
}

// Resume thaws it.
func (c *Client) Resume(ctx context.Context, s *session.Session) error {
	return c.call(ctx, s.NodeID, "POST", "/v1/sessions/"+s.ID+":resume", nil, nil)
}

// Snapshot saves it.
func (c *Client) Snapshot(ctx context.Context, s *session.Session, snapshotID string, memory bool) (bool, int64, error) {
	var res struct {
		Memory    bool  `json:"memory"`
		SizeBytes int64 `json:"size_bytes"`
	}
	err := c.call(ctx, s.NodeID, "POST", "/v1/sessions/"+s.ID+":snapshot",
		map[string]any{"snapshot_id": snapshotID, "include_memory": memory}, &res)
	return res.Memory, res.SizeBytes, err
}

// Stop tears the guest down; the node ends the session.
func (c *Client) Stop(ctx context.Context, s *session.Session) error {
	if s.NodeID == "" {
		return nil // never placed: nothing to tear down
	}
	return c.call(ctx, s.NodeID, "POST", "/v1/sessions/"+s.ID+":stop", s, nil)
}

// DeleteSnapshot removes a snapshot's files from every node that may hold them.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	nodes, err := c.st.Nodes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes {
		c.mu.Lock()
		c.addrs[n.ID] = n.Addr
		c.mu.Unlock()
		if err := c.call(ctx, n.ID, "DELETE", "/v1/snapshots/"+id, nil, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
