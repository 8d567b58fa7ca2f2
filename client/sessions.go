package client

import (
	"context"
	"iter"
	"net/http"
	"net/url"
)

// CreateSession starts a session (201, in pending); with RestoreFrom, a new session from a
// snapshot. Await it with WaitSession.
func (c *Client) CreateSession(ctx context.Context, req CreateSessionRequest) (*Session, error) {
	var s Session
	return &s, c.do(ctx, http.MethodPost, "/v1/sessions", nil, req, &s)
}

// GetSession answers a session.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	return &s, c.do(ctx, http.MethodGet, "/v1/sessions/"+pathID(id), nil, nil, &s)
}

// ListSessions answers one page of the project's sessions, newest first.
func (c *Client) ListSessions(ctx context.Context, req ListSessionsRequest) (*List[Session], error) {
	q := url.Values{}
	if req.State != "" {
		q.Set("state", string(req.State))
	}
	if req.EndUserID != "" {
		q.Set("end_user_id", req.EndUserID)
	}
	var l List[Session]
	return &l, c.do(ctx, http.MethodGet, "/v1/sessions", pageQuery(q, req.Page), nil, &l)
}

// AllSessions walks every page of ListSessions; it stops at the first error, which it yields.
func (c *Client) AllSessions(ctx context.Context, req ListSessionsRequest) iter.Seq2[Session, error] {
	return paginate(func(cursor string) (*List[Session], error) {
		req.Cursor = cursor
		return c.ListSessions(ctx, req)
	}, req.Cursor)
}

// paginate yields the items of page after page until the last.
func paginate[T any](page func(cursor string) (*List[T], error), cursor string) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for {
			l, err := page(cursor)
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			for _, v := range l.Data {
				if !yield(v, nil) {
					return
				}
			}
			if l.NextCursor == nil || *l.NextCursor == "" {
				return
			}
			cursor = *l.NextCursor
		}
	}
}

// UpdateSession changes a session's timers.
func (c *Client) UpdateSession(ctx context.Context, id string, req UpdateSessionRequest) (*Session, error) {
	var s Session
	return &s, c.do(ctx, http.MethodPatch, "/v1/sessions/"+pathID(id), nil, req, &s)
}

// DeleteSession stops a session: it answers it in stopping (or as it is, once stopped).
func (c *Client) DeleteSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	return &s, c.do(ctx, http.MethodDelete, "/v1/sessions/"+pathID(id), nil, nil, &s)
}

// PauseSession pauses a running session (tier 2 and up).
func (c *Client) PauseSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	return &s, c.do(ctx, http.MethodPost, "/v1/sessions/"+pathID(id)+":pause", nil, struct{}{}, &s)
}

// ResumeSession resumes a paused session.
func (c *Client) ResumeSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	return &s, c.do(ctx, http.MethodPost, "/v1/sessions/"+pathID(id)+":resume", nil, struct{}{}, &s)
}

// SnapshotSession snapshots a running session (201); restore it with CreateSession's
// RestoreFrom.
func (c *Client) SnapshotSession(ctx context.Context, id string, req SnapshotRequest) (*Snapshot, error) {
	var s Snapshot
	return &s, c.do(ctx, http.MethodPost, "/v1/sessions/"+pathID(id)+":snapshot", nil, req, &s)
}

// GetSnapshot answers a snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	var s Snapshot
	return &s, c.do(ctx, http.MethodGet, "/v1/snapshots/"+pathID(id), nil, nil, &s)
}

// ListSnapshots answers one page of the project's snapshots, newest first.
func (c *Client) ListSnapshots(ctx context.Context, p Page) (*List[Snapshot], error) {
	var l List[Snapshot]
	return &l, c.do(ctx, http.MethodGet, "/v1/snapshots", pageQuery(nil, p), nil, &l)
}

// AllSnapshots walks every page of ListSnapshots.
func (c *Client) AllSnapshots(ctx context.Context, p Page) iter.Seq2[Snapshot, error] {
	return paginate(func(cursor string) (*List[Snapshot], error) {
		p.Cursor = cursor
		return c.ListSnapshots(ctx, p)
	}, p.Cursor)
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) (*Deleted, error) {
	var d Deleted
	return &d, c.do(ctx, http.MethodDelete, "/v1/snapshots/"+pathID(id), nil, nil, &d)
}

// CreateRun runs one command in a session, or an ephemeral tier-1 run; it waits for the end
// unless req.NoWait.
func (c *Client) CreateRun(ctx context.Context, req CreateRunRequest) (*Run, error) {
	var q url.Values
	if req.NoWait {
		q = url.Values{"wait": {"false"}}
	}
	var r Run
	return &r, c.do(ctx, http.MethodPost, "/v1/runs", q, req, &r)
}

// GetRun answers a run.
func (c *Client) GetRun(ctx context.Context, id string) (*Run, error) {
	var r Run
	return &r, c.do(ctx, http.MethodGet, "/v1/runs/"+pathID(id), nil, nil, &r)
}
