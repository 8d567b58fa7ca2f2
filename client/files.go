package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
)

func filesQuery(path string) url.Values { return url.Values{"path": {path}} }

// ReadFile opens a file of a running session; the caller closes it.
func (c *Client) ReadFile(ctx context.Context, sessionID, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/v1/sessions/" + pathID(sessionID) + "/files",
		query: filesQuery(path), accept: "application/octet-stream"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// DownloadFile answers a whole file of a running session.
func (c *Client) DownloadFile(ctx context.Context, sessionID, path string) ([]byte, error) {
	rc, err := c.ReadFile(ctx, sessionID, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// UploadFile writes content to path in a running session (at most 100 MiB), replacing the
// file. A content that is an io.Seeker (bytes.Reader, os.File) can be retried on 429/503.
func (c *Client) UploadFile(ctx context.Context, sessionID, path string, content io.Reader) error {
	resp, err := c.send(ctx, request{method: http.MethodPut, path: "/v1/sessions/" + pathID(sessionID) + "/files",
		query: filesQuery(path), bodyReader: content, contentType: "application/octet-stream"})
	if err != nil {
		return err
	}
	return decodeJSON(resp, http.MethodPut, "files", nil)
}

// ListFiles lists a directory of a running session, sorted by name.
func (c *Client) ListFiles(ctx context.Context, sessionID, dir string) (*List[FileInfo], error) {
	q := filesQuery(dir)
	q.Set("list", "1")
	var l List[FileInfo]
	return &l, c.do(ctx, http.MethodGet, "/v1/sessions/"+pathID(sessionID)+"/files", q, nil, &l)
}

// DeleteFile removes a file of a running session.
func (c *Client) DeleteFile(ctx context.Context, sessionID, path string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sessions/"+pathID(sessionID)+"/files", filesQuery(path), nil, nil)
}
