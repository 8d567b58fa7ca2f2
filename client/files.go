package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
)

func filesQuery(path string) url.Values { return url.Values{"path": {path}} }

// filesRoute is the files route of a session or a desktop.
func filesRoute(collection, id string) string {
	return "/v1/" + collection + "/" + pathID(id) + "/files"
}

// ReadFile opens a file of a running session; the caller closes it.
func (c *Client) ReadFile(ctx context.Context, sessionID, path string) (io.ReadCloser, error) {
	return c.readFileAt(ctx, filesRoute("sessions", sessionID), path)
}

// DownloadFile answers a whole file of a running session.
func (c *Client) DownloadFile(ctx context.Context, sessionID, path string) ([]byte, error) {
	return c.downloadFileAt(ctx, filesRoute("sessions", sessionID), path)
}

// UploadFile writes content to path in a running session (at most 100 MiB), replacing the
// file. A content that is an io.Seeker (bytes.Reader, os.File) can be retried on 429/503.
func (c *Client) UploadFile(ctx context.Context, sessionID, path string, content io.Reader) error {
	return c.uploadFileAt(ctx, filesRoute("sessions", sessionID), path, content)
}

// ListFiles lists a directory of a running session, sorted by name.
func (c *Client) ListFiles(ctx context.Context, sessionID, dir string) (*List[FileInfo], error) {
	return c.listFilesAt(ctx, filesRoute("sessions", sessionID), dir)
}

// DeleteFile removes a file of a running session.
func (c *Client) DeleteFile(ctx context.Context, sessionID, path string) error {
	return c.do(ctx, http.MethodDelete, filesRoute("sessions", sessionID), filesQuery(path), nil, nil)
}

func (c *Client) readFileAt(ctx context.Context, route, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: route, query: filesQuery(path), accept: "application/octet-stream"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

func (c *Client) downloadFileAt(ctx context.Context, route, path string) ([]byte, error) {
	rc, err := c.readFileAt(ctx, route, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func (c *Client) uploadFileAt(ctx context.Context, route, path string, content io.Reader) error {
	resp, err := c.send(ctx, request{method: http.MethodPut, path: route, query: filesQuery(path), bodyReader: content, contentType: "application/octet-stream"})
	if err != nil {
		return err
	}
	return decodeJSON(resp, http.MethodPut, "files", nil)
}

func (c *Client) listFilesAt(ctx context.Context, route, dir string) (*List[FileInfo], error) {
	q := filesQuery(dir)
	q.Set("list", "1")
	var l List[FileInfo]
	return &l, c.do(ctx, http.MethodGet, route, q, nil, &l)
}
