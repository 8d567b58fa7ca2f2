package client

import (
	"context"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"

	"wb/desktop"
)

// Desktop is a desktop (seed 001): a long-lived machine that sleeps when unused and wakes when
// asked (or on an MCP call); see the desktop package for its states.
type Desktop = desktop.Desktop

// CreateDesktopRequest is the body of POST /v1/desktops; Size "" is the smallest.
type CreateDesktopRequest struct {
	Name string       `json:"name"`
	Size desktop.Size `json:"size,omitempty"`
}

// ResizeDesktopRequest is the body of PATCH /v1/desktops/{id}: an asleep or stopped desktop
// has the new size at once, an awake one from its next start.
type ResizeDesktopRequest struct {
	Size desktop.Size `json:"size"`
}

// CreateDesktop creates a desktop; it answers it starting.
func (c *Client) CreateDesktop(ctx context.Context, req CreateDesktopRequest) (*Desktop, error) {
	var d Desktop
	return &d, c.do(ctx, http.MethodPost, "/v1/desktops", nil, req, &d)
}

// GetDesktop answers a desktop.
func (c *Client) GetDesktop(ctx context.Context, id string) (*Desktop, error) {
	var d Desktop
	return &d, c.do(ctx, http.MethodGet, "/v1/desktops/"+pathID(id), nil, nil, &d)
}

// ListDesktops answers one page of the project's desktops, newest first (listing is not use:
// it keeps no desktop awake).
func (c *Client) ListDesktops(ctx context.Context, page Page) (*List[Desktop], error) {
	var l List[Desktop]
	return &l, c.do(ctx, http.MethodGet, "/v1/desktops", pageQuery(url.Values{}, page), nil, &l)
}

// AllDesktops walks every page of ListDesktops; it stops at the first error, which it yields.
func (c *Client) AllDesktops(ctx context.Context, page Page) iter.Seq2[Desktop, error] {
	return paginate(func(cursor string) (*List[Desktop], error) {
		page.Cursor = cursor
		return c.ListDesktops(ctx, page)
	}, page.Cursor)
}

// ResizeDesktop changes a desktop's size.
func (c *Client) ResizeDesktop(ctx context.Context, id string, req ResizeDesktopRequest) (*Desktop, error) {
	var d Desktop
	return &d, c.do(ctx, http.MethodPatch, "/v1/desktops/"+pathID(id), nil, req, &d)
}

// DeleteDesktop removes a desktop, its disk and its saved state.
func (c *Client) DeleteDesktop(ctx context.Context, id string) (*Deleted, error) {
	var d Deleted
	return &d, c.do(ctx, http.MethodDelete, "/v1/desktops/"+pathID(id), nil, nil, &d)
}

// SleepDesktop snapshots a running desktop and stops it; it answers it stopping.
func (c *Client) SleepDesktop(ctx context.Context, id string) (*Desktop, error) {
	return c.desktopAction(ctx, id, "sleep")
}

// WakeDesktop starts an asleep desktop from its saved state; it answers it starting.
func (c *Client) WakeDesktop(ctx context.Context, id string) (*Desktop, error) {
	return c.desktopAction(ctx, id, "wake")
}

// StopDesktop stops a desktop, keeping its disk only.
func (c *Client) StopDesktop(ctx context.Context, id string) (*Desktop, error) {
	return c.desktopAction(ctx, id, "stop")
}

// StartDesktop starts a stopped desktop fresh from its disk; it answers it starting.
func (c *Client) StartDesktop(ctx context.Context, id string) (*Desktop, error) {
	return c.desktopAction(ctx, id, "start")
}

func (c *Client) desktopAction(ctx context.Context, id, action string) (*Desktop, error) {
	var d Desktop
	return &d, c.do(ctx, http.MethodPost, "/v1/desktops/"+pathID(id)+":"+action, nil, struct{}{}, &d)
}

// maxScreenBytes bounds the PNG GetDesktopScreen reads: a 1280×800 display is well below it.
const maxScreenBytes = 32 << 20

// GetDesktopScreen answers a PNG of a running desktop's display (409 for a desktop in any
// other state). It never wakes the desktop and is not a use: it keeps it awake no longer.
func (c *Client) GetDesktopScreen(ctx context.Context, id string) ([]byte, error) {
	path := "/v1/desktops/" + pathID(id) + "/screen"
	resp, err := c.send(ctx, request{method: http.MethodGet, path: path, accept: "image/png"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxScreenBytes+1))
	if err != nil {
		return nil, fmt.Errorf("wb: read the answer of GET %s: %w", path, err)
	}
	if len(b) > maxScreenBytes {
		return nil, fmt.Errorf("wb: GET %s answered more than %d bytes", path, maxScreenBytes)
	}
	return b, nil
}

// HeartbeatDesktop records a use of the desktop, as a console whose screen is visible does:
// an awake desktop stays awake for the idle time from now; any other is left as it is (a
// heartbeat never wakes one). It answers the desktop.
func (c *Client) HeartbeatDesktop(ctx context.Context, id string) (*Desktop, error) {
	var d Desktop
	return &d, c.do(ctx, http.MethodPost, "/v1/desktops/"+pathID(id)+"/heartbeat", nil, struct{}{}, &d)
}

// A desktop's files are its session's, with the desktop's rules of use (seed 001): sending
// or deleting a file is a use, which wakes an asleep desktop and answers once it runs;
// reading or listing is none, and an asleep desktop answers 409 to it (wake it first).

// ReadDesktopFile opens a file of a running desktop; the caller closes it.
func (c *Client) ReadDesktopFile(ctx context.Context, desktopID, path string) (io.ReadCloser, error) {
	return c.readFileAt(ctx, filesRoute("desktops", desktopID), path)
}

// DownloadDesktopFile answers a whole file of a running desktop.
func (c *Client) DownloadDesktopFile(ctx context.Context, desktopID, path string) ([]byte, error) {
	return c.downloadFileAt(ctx, filesRoute("desktops", desktopID), path)
}

// UploadDesktopFile writes content to path on a desktop (at most 100 MiB), waking it when
// asleep. A content that is an io.Seeker can be retried on 429/503.
func (c *Client) UploadDesktopFile(ctx context.Context, desktopID, path string, content io.Reader) error {
	return c.uploadFileAt(ctx, filesRoute("desktops", desktopID), path, content)
}

// ListDesktopFiles lists a directory of a running desktop, sorted by name.
func (c *Client) ListDesktopFiles(ctx context.Context, desktopID, dir string) (*List[FileInfo], error) {
	return c.listFilesAt(ctx, filesRoute("desktops", desktopID), dir)
}

// DeleteDesktopFile removes a file of a desktop, waking it when asleep.
func (c *Client) DeleteDesktopFile(ctx context.Context, desktopID, path string) error {
	return c.do(ctx, http.MethodDelete, filesRoute("desktops", desktopID), filesQuery(path), nil, nil)
}

// MCPHTTPClient answers an HTTP client that sends this client's API key (and User-Agent),
// over WithHTTPClient's transport: give it to an MCP client's Streamable HTTP transport with
// a desktop's MCPURL, e.g. the official Go SDK's
//
//	&mcp.StreamableClientTransport{Endpoint: d.MCPURL, HTTPClient: c.MCPHTTPClient()}
func (c *Client) MCPHTTPClient() *http.Client {
	hc := *c.http
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc.Transport = keyTransport{base: base, key: c.apiKey, userAgent: c.userAgent}
	return &hc
}

// keyTransport adds the API key to each request.
type keyTransport struct {
	base           http.RoundTripper
	key, userAgent string
}

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.key)
	if t.userAgent != "" {
		r.Header.Set("User-Agent", t.userAgent)
	}
	return t.base.RoundTrip(r)
}
