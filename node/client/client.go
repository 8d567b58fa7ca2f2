// Package client is the control plane's side of the node API (its types are package
// nodeapi): it provisions sessions on nodes (placer.Provisioner) and reaches their guests
// (gateway.Guests), finding each session's node through the registrations in Redis. A node's
// error answer is an *nodeapi.Error, with its status and code; a node it cannot reach is any
// other error.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"wb/agent"
	"wb/hypervisor"
	"wb/node/nodeapi"
	"wb/session"
	"wb/store"
)

// Client talks to every node with one shared token. Safe for concurrent use.
type Client struct {
	st      *store.Store
	hc      *http.Client
	token   string
	tlsOnly bool // WithDialTLS: a node registered http:// off loopback is refused

	mu      sync.Mutex
	addrs   map[string]string    // node id → base URL
	fetched time.Time            // when addrs was last read
	touched map[string]time.Time // session → last touch sent
}

// Option configures a Client.
type Option func(*Client, *http.Transport)

// WithDialTLS has the client reach nodes registered with https:// URLs (wb node
// --fleet-tls-*) through dial, which presents this gateway's certificate and verifies the
// node's (mtls.Dialer.DialTLSContext). A node registered with an http:// URL off loopback is
// then refused, not sent the token and the exec traffic in plaintext (one left without
// --fleet-tls-*, or an older one during a rollout).
func WithDialTLS(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(c *Client, t *http.Transport) { t.DialTLSContext, c.tlsOnly = dial, true }
}

// New returns a client of the nodes registered in st.
func New(st *store.Store, token string, opts ...Option) *Client {
	// No encoding is asked for or decoded: a node from before it refused its agents' encoded
	// answers passes a guest's agent's gzipped one on past its checks (an exec's lines, an
	// error's code), which read the compressed bytes.
	tr := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 60 * time.Second, DisableCompression: true}
	c := &Client{st: st, token: token, addrs: map[string]string{}, touched: map[string]time.Time{}}
	for _, o := range opts {
		o(c, tr)
	}
	// No redirect is followed: a node answers none of its own, and one from a guest's agent,
	// which the guest may replace, passed on by a node from before it refused them, would
	// resend the request with the node token to another session's agent on the node or to
	// any other URL. A 3xx is then an error (call; agent.Client, which follows none either).
	c.hc = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c
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
	if c.tlsOnly && plaintextOffLoopback(a) {
		return "", fmt.Errorf("node %q is registered at a plaintext URL, but this gateway speaks to nodes over mutual TLS (--fleet-tls-*): run the node with --fleet-tls-* too", nodeID)
	}
	return a, nil
}

// plaintextOffLoopback reports whether base is an http:// URL whose host is not a loopback
// address (an embedded node's, which stays plaintext on loopback).
func plaintextOffLoopback(base string) bool {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" {
		return false
	}
	if u.Hostname() == "localhost" {
		return false
	}
	ip := net.ParseIP(u.Hostname())
	return ip == nil || !ip.IsLoopback()
}

// call sends in (when not nil) as JSON and decodes the answer into out (when not nil). An
// error answer of the node is an *nodeapi.Error with its status and code, wrapped with the
// node's id; a failure to reach the node is any other error.
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
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("node %s: %w", nodeID, nodeapi.ParseError(resp.StatusCode, b))
	}
	// 204: no answer, out stays as it was (a node from before StopSaving answers its stop so:
	// nothing was saved).
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return fmt.Errorf("node %s: %s %s: decode the answer: %w", nodeID, method, path, err)
		}
	}
	return nil
}

// Provision asks the node to start the session's guest.
func (c *Client) Provision(ctx context.Context, n store.NodeInfo, s *session.Session) error {
	c.mu.Lock()
	c.addrs[n.ID] = n.Addr
	c.mu.Unlock()
	var accepted nodeapi.ProvisionAccepted
	return c.call(ctx, n.ID, "POST", nodeapi.PathProvision, (*nodeapi.ProvisionRequest)(s), &accepted)
}

// Agent answers a client of the session's agent, through its node's proxy.
func (c *Client) Agent(ctx context.Context, s *session.Session) (*agent.Client, error) {
	base, err := c.addr(ctx, s.NodeID)
	if err != nil {
		return nil, err
	}
	return agent.NewHTTPClient(c.hc, base+nodeapi.AgentBase(s.ID), c.token), nil
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
	_ = c.call(ctx, s.NodeID, "POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionTouch), nil, nil)
}

// Retime hands the node the session's new timers; the node refuses timers it cannot apply
// (an *nodeapi.Error: 404 when it holds no guest for the session, 409 when the guest is
// stopping or ended there).
func (c *Client) Retime(ctx context.Context, s *session.Session) error {
	return c.call(ctx, s.NodeID, "POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionRetime),
		nodeapi.RetimeRequest{IdleTimeoutS: s.IdleTimeoutS, MaxLifetimeS: s.MaxLifetimeS}, nil)
}

// Pause freezes the guest.
func (c *Client) Pause(ctx context.Context, s *session.Session) error {
	return c.call(ctx, s.NodeID, "POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionPause), nil, nil)
}

// Resume thaws it.
func (c *Client) Resume(ctx context.Context, s *session.Session) error {
	return c.call(ctx, s.NodeID, "POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionResume), nil, nil)
}

// Snapshot saves it.
func (c *Client) Snapshot(ctx context.Context, s *session.Session, snapshotID string, memory bool) (hypervisor.SnapshotInfo, error) {
	var res nodeapi.SnapshotResult
	err := c.call(ctx, s.NodeID, "POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionSnapshot),
		nodeapi.SnapshotRequest{SnapshotID: snapshotID, IncludeMemory: memory}, &res)
	return hypervisor.SnapshotInfo{Memory: res.Memory, SizeBytes: res.SizeBytes, RootImage: res.RootImage}, err
}

// Stop tears the guest down; the node ends the session.
func (c *Client) Stop(ctx context.Context, s *session.Session) error {
	if s.NodeID == "" {
		return nil // never placed: nothing to tear down
	}
	return c.call(ctx, s.NodeID, "POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionStop), stopRequest(s, ""), nil)
}

// StopSaving is Stop after the node saved the guest, memory and all, as snapshot
// snapshotID where it can; it answers whether memory was saved, the size and the root disk
// image its restore needs (none from an earlier node: restored anywhere, as before).
func (c *Client) StopSaving(ctx context.Context, s *session.Session, snapshotID string) (hypervisor.SnapshotInfo, error) {
	if s.NodeID == "" {
		return hypervisor.SnapshotInfo{}, nil // never placed: nothing to save or tear down
	}
	var res nodeapi.SnapshotResult
	err := c.call(ctx, s.NodeID, "POST", nodeapi.SessionActionPath(s.ID, nodeapi.ActionStop), stopRequest(s, snapshotID), &res)
	return hypervisor.SnapshotInfo{Memory: res.Memory, SizeBytes: res.SizeBytes, RootImage: res.RootImage}, err
}

func stopRequest(s *session.Session, saveAs string) nodeapi.StopRequest {
	req := nodeapi.StopRequest{ProjectID: s.ProjectID, SaveAs: saveAs}
	if s.StateReason != nil {
		req.Reason = *s.StateReason
	}
	if s.Rule != nil {
		req.Rule = *s.Rule
	}
	return req
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
		if err := c.call(ctx, n.ID, "DELETE", nodeapi.SnapshotPath(id), nil, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
