package chapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"syscall"
	"time"
)

// MaxResponseBytes bounds what the client reads of one answer. vm.info, the largest, is a
// few KiB; anything near this is a VMM gone wrong, not an answer.
const MaxResponseBytes = 1 << 20

// Client calls one VMM's API. It is safe for concurrent use; the server itself handles one
// request at a time.
type Client struct {
	socketPath string
	http       *http.Client
}

// New returns a client of the VMM listening on socketPath (its --api-socket path=). It does
// not connect until the first call.
func New(socketPath string) *Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	return &Client{
		socketPath: socketPath,
		http: &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialer.DialContext(ctx, "unix", socketPath)
			},
			// One connection per call: a reused connection that the VMM closed while idle
			// would fail a PUT (net/http does not replay them), and a dial on a Unix
			// socket costs microseconds.
			DisableKeepAlives:  true,
			DisableCompression: true,
		}},
	}
}

// Ping asks the VMM who it is (GET vmm.ping); it answers as soon as its API server runs.
func (c *Client) Ping(ctx context.Context) (VmmPingResponse, error) {
	var out VmmPingResponse
	return out, c.get(ctx, "vmm.ping", &out)
}

// CreateVM creates the VM from cfg without booting it (PUT vm.create).
func (c *Client) CreateVM(ctx context.Context, cfg VmConfig) error {
	return c.put(ctx, "vm.create", cfg, nil)
}

// BootVM boots the created VM (PUT vm.boot).
func (c *Client) BootVM(ctx context.Context) error { return c.put(ctx, "vm.boot", nil, nil) }

// PauseVM pauses the running VM's vCPUs and devices (PUT vm.pause).
func (c *Client) PauseVM(ctx context.Context) error { return c.put(ctx, "vm.pause", nil, nil) }

// ResumeVM resumes the paused VM (PUT vm.resume).
func (c *Client) ResumeVM(ctx context.Context) error { return c.put(ctx, "vm.resume", nil, nil) }

// SnapshotVM writes the paused VM's state to cfg.DestinationURL (PUT vm.snapshot).
func (c *Client) SnapshotVM(ctx context.Context, cfg VmSnapshotConfig) error {
	return c.put(ctx, "vm.snapshot", cfg, nil)
}

// RestoreVM creates the VM from a snapshot (PUT vm.restore); it is Paused afterwards
// unless cfg.Resume.
func (c *Client) RestoreVM(ctx context.Context, cfg RestoreConfig) error {
	return c.put(ctx, "vm.restore", cfg, nil)
}

// ShutdownVM stops the VM; it can be booted again (PUT vm.shutdown).
func (c *Client) ShutdownVM(ctx context.Context) error {
	return c.put(ctx, "vm.shutdown", nil, nil)
}

// DeleteVM stops the VM if it runs and forgets it (PUT vm.delete).
func (c *Client) DeleteVM(ctx context.Context) error { return c.put(ctx, "vm.delete", nil, nil) }

// VMInfo reports the VM's configuration and state (GET vm.info).
func (c *Client) VMInfo(ctx context.Context) (VmInfo, error) {
	var out VmInfo
	return out, c.get(ctx, "vm.info", &out)
}

// VMCounters reports the devices' counters (GET vm.counters).
func (c *Client) VMCounters(ctx context.Context) (VmCounters, error) {
	var out VmCounters
	return out, c.get(ctx, "vm.counters", &out)
}

// ResizeVM changes the vCPU count and/or memory size (PUT vm.resize). The server answers
// 429 while an earlier vCPU removal is pending: try again later.
func (c *Client) ResizeVM(ctx context.Context, r VmResize) error {
	return c.put(ctx, "vm.resize", r, nil)
}

// AddVsock adds a vsock device (PUT vm.add-vsock). On a VM not booted yet the device is
// cold-added and the PciDeviceInfo is zero.
func (c *Client) AddVsock(ctx context.Context, cfg VsockConfig) (PciDeviceInfo, error) {
	var out PciDeviceInfo
	return out, c.put(ctx, "vm.add-vsock", cfg, &out)
}

// AddNet adds a network device (PUT vm.add-net). On a VM not booted yet the device is
// cold-added and the PciDeviceInfo is zero.
func (c *Client) AddNet(ctx context.Context, cfg NetConfig) (PciDeviceInfo, error) {
	var out PciDeviceInfo
	return out, c.put(ctx, "vm.add-net", cfg, &out)
}

// ShutdownVMM stops the VM and makes the VMM process exit (PUT vmm.shutdown). The VMM may
// exit before it answers; a connection it closes without an answer counts as done. A VMM
// that cannot be reached at all is an error: nothing was asked.
func (c *Client) ShutdownVMM(ctx context.Context) error {
	var connected atomic.Bool
	traced := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	err := c.put(traced, "vmm.shutdown", nil, nil)
	var apiErr *APIError
	if err != nil && connected.Load() && !errors.As(err, &apiErr) && ctx.Err() == nil && closedWithoutAnswer(err) {
		return nil
	}
	return err
}

// closedWithoutAnswer reports whether err is the peer closing the connection before a
// complete answer.
func closedWithoutAnswer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (c *Client) get(ctx context.Context, op string, out any) error {
	return c.do(ctx, http.MethodGet, op, nil, out, true)
}

// put sends body (nil: none) and decodes a 200's answer into out (nil: none expected; a
// 204 leaves out as it is).
func (c *Client) put(ctx context.Context, op string, body, out any) error {
	return c.do(ctx, http.MethodPut, op, body, out, false)
}

func (c *Client) do(ctx context.Context, method, op string, body, out any, answerRequired bool) error {
	var reqBody io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("chapi: %s: encode the request: %w", op, err)
		}
		reqBody = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost/api/v1/"+op, reqBody)
	if err != nil {
		return fmt.Errorf("chapi: %s: %w", op, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("chapi: %s: call the VMM on %s (is cloud-hypervisor running with --api-socket path=%s?): %w",
			op, c.socketPath, c.socketPath, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("chapi: %s: read the answer (%d): %w", op, resp.StatusCode, err)
	}
	if len(data) > MaxResponseBytes {
		return fmt.Errorf("chapi: %s: the VMM answered %d with more than %d bytes; an answer is never that large, so the VMM is not behaving", op, resp.StatusCode, MaxResponseBytes)
	}
	switch {
	case resp.StatusCode >= 400:
		return newAPIError(op, resp.StatusCode, data)
	case resp.StatusCode == http.StatusNoContent && !answerRequired:
		return nil
	case resp.StatusCode == http.StatusOK:
		if out == nil {
			return nil // e.g. vmm.shutdown's 200, which has no body
		}
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("chapi: %s: the VMM's answer is not the document's %T: %w (answer: %q)", op, out, err, clip(data, 200))
		}
		return nil
	default:
		return fmt.Errorf("chapi: %s: the VMM answered %d, which cloud-hypervisor.yaml does not allow here (answer: %q)", op, resp.StatusCode, clip(data, 200))
	}
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
