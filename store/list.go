package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// ListQuery filters a project's sessions, newest first.
type ListQuery struct {
	State     session.State // "" for any
	EndUserID string        // "" for any
	Limit     int           // 1–100; 0 means 10
	Cursor    string        // next_cursor of the previous page
}

// Page is one page of a list.
type Page struct {
	Sessions   []*session.Session
	NextCursor string // "" when there is nothing more
}

// MaxListLimit bounds ?limit=.
const MaxListLimit = 100

// maxScan bounds how many index entries one List call examines when filters drop most.
const maxScan = 2000

// List returns a page of the project's sessions. It walks the narrowest index (state, then
// end user, then all) and filters the rest, so a page may come back short with a cursor
// when filters drop many entries.
func (s *Store) List(ctx context.Context, project string, q ListQuery) (Page, error) {
	if q.Limit == 0 {
		q.Limit = 10
	}
	if q.Limit < 1 || q.Limit > MaxListLimit {
		return Page{}, &session.FieldError{Field: "limit", Message: fmt.Sprintf("must be 1–%d, got %d", MaxListLimit, q.Limit)}
	}
	if q.State != "" && !q.State.Valid() {
		_, err := session.ParseState("state", string(q.State))
		return Page{}, err
	}
	if q.Cursor != "" && (!strings.HasPrefix(q.Cursor, "sess_") || !validCursor(q.Cursor)) {
		return Page{}, &session.FieldError{Field: "cursor", Message: "not a cursor this API returned"}
	}
	k := ProjectKeys(project)
	index := k.all()
	switch {
	case q.State != "":
		index = k.byState(q.State)
	case q.EndUserID != "":
		index = k.byEndUser(q.EndUserID)
	}
	max := "+"
	if q.Cursor != "" {
		max = "(" + q.Cursor
	}
	var page Page
	scanned := 0
	batch := int64(q.Limit + 1)
	for scanned < maxScan {
		ids, err := s.rdb.ZRevRangeByLex(ctx, index, &redis.ZRangeBy{Max: max, Min: "-", Count: batch}).Result()
		if err != nil {
			return Page{}, fmt.Errorf("list sessions: %w", err)
		}
		if len(ids) == 0 {
			return page, nil
		}
		cmds := make([]*redis.MapStringStringCmd, len(ids))
		_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				cmds[i] = p.HGetAll(ctx, k.session(id))
			}
			return nil
		})
		if err != nil {
			return Page{}, fmt.Errorf("list sessions: %w", err)
		}
		var gone []any
		for i, cmd := range cmds {
			scanned++
			m := cmd.Val()
			if len(m) == 0 { // retention expired: drop the stale index entry
				gone = append(gone, ids[i])
				continue
			}
			sess, err := decode(m)
			if err != nil {
				return Page{}, err
			}
			if (q.State != "" && sess.State != q.State) ||
				(q.EndUserID != "" && (sess.EndUserID == nil || *sess.EndUserID != q.EndUserID)) {
				continue
			}
			if len(page.Sessions) == q.Limit {
				page.NextCursor = page.Sessions[len(page.Sessions)-1].ID
				s.dropStale(ctx, k, gone, q.EndUserID)
				return page, nil
			}
			page.Sessions = append(page.Sessions, sess)
		}
		s.dropStale(ctx, k, gone, q.EndUserID)
		max = "(" + ids[len(ids)-1]
		if int64(len(ids)) < batch {
			return page, nil
		}
	}
	page.NextCursor = strings.TrimPrefix(max, "(")
	return page, nil
}

// dropStale drops from the indexes sessions whose hash expired (and from endUser's index,
// when the list walked it); trimRetained drops the rest without a listing.
func (s *Store) dropStale(ctx context.Context, k ProjectKeyspace, ids []any, endUser string) {
	if len(ids) == 0 {
		return
	}
	// Best effort: a stale entry that survives is dropped on the next read.
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, k.all(), ids...)
		for _, st := range session.States() {
			p.ZRem(ctx, k.byState(st), ids...)
		}
		if endUser != "" {
			p.ZRem(ctx, k.byEndUser(endUser), ids...)
		}
		return nil
	})
}

// validCursor accepts an id this API made: a lowercase prefix, "_", then base62.
func validCursor(c string) bool {
	prefix, rest, ok := strings.Cut(c, "_")
	if !ok || prefix == "" || rest == "" || len(c) > 64 {
		return false
	}
	for _, r := range prefix {
		if r < 'a' || r > 'z' {
			return false
		}
	}
	for _, r := range rest {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// CountByState counts every project's sessions per state (terminal ones while retained).
func (s *Store) CountByState(ctx context.Context) (map[session.State]int64, error) {
	projects, err := s.Projects(ctx)
	if err != nil {
		return nil, err
	}
	out := map[session.State]int64{}
	for _, p := range projects {
		k := ProjectKeys(p)
		cmds := map[session.State]*redis.IntCmd{}
		if _, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for _, st := range session.States() {
				cmds[st] = pl.ZCard(ctx, k.byState(st))
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("count sessions: %w", err)
		}
		for st, c := range cmds {
			out[st] += c.Val()
		}
	}
	return out, nil
}

// IDsInState lists up to limit ids of the project's sessions in state, oldest first.
func (s *Store) IDsInState(ctx context.Context, project string, st session.State, limit int64) ([]string, error) {
	ids, err := s.rdb.ZRangeByLex(ctx, ProjectKeys(project).byState(st), &redis.ZRangeBy{Min: "-", Max: "+", Count: limit}).Result()
	if err != nil {
		return nil, fmt.Errorf("sessions in %s: %w", st, err)
	}
	return ids, nil
}

// IDsInStates lists up to limit ids of the project's sessions in each of states, all read at
// one instant (one transaction): a session that moves from one of them to another meanwhile
// is listed once, where listing state after state could miss it.
func (s *Store) IDsInStates(ctx context.Context, project string, states []session.State, limit int64) ([]string, error) {
	k := ProjectKeys(project)
	cmds := make([]*redis.StringSliceCmd, len(states))
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, st := range states {
			cmds[i] = p.ZRangeByLex(ctx, k.byState(st), &redis.ZRangeBy{Min: "-", Max: "+", Count: limit})
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("sessions in %v: %w", states, err)
	}
	var ids []string
	for _, c := range cmds {
		ids = append(ids, c.Val()...)
	}
	return ids, nil
}
