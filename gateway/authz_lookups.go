package gateway

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"wb/session"
	"wb/store"
)

// ext_authz answers every exec, PTY and file request of the fleet, so it remembers what it
// read of a session (its state and node) instead of asking Redis each time. What it
// remembers is dropped when the session's project changes:
//
//   - at once, by this gateway's own transitions (pause, resume, snapshot, delete:
//     forgetSessions), so a session this gateway paused is refused by the next Check;
//   - within a Redis round trip, by every other writer's: each transition signals its project
//     on the outbox signal stream, which watchSessions tails (store.TailSignals) without
//     taking the signals from the webhook dispatcher that consumes them;
//   - and after lookupTTL in any case, for a signal the tail missed (a writer that died
//     before signalling, a signal deleted between two reads of the tail, Redis unreachable).

// lookupTTL bounds how long a cached lookup is trusted without an event.
const lookupTTL = time.Second

// maxLookups bounds the cache; past it everything is dropped and read again.
const maxLookups = 100_000

// watchWait is how long one read of the signal tail blocks; it is also how long a tail may
// outlive the Server's Close.
const watchWait = 10 * time.Second

// sessionFacts is what ext_authz needs of a session.
type sessionFacts struct {
	found  bool
	state  session.State
	nodeID string
}

type lookupEntry struct {
	facts sessionFacts
	exp   time.Time
}

// projectLookups are one project's cached sessions. gen counts the times they were dropped,
// so that a read that started before a drop does not store what it read after it.
type projectLookups struct {
	gen      uint64
	sessions map[string]lookupEntry
}

// sessionLookups caches (project, session) → sessionFacts. epoch counts full flushes as gen
// counts a project's drops. Its zero value is ready.
type sessionLookups struct {
	mu       sync.RWMutex
	epoch    uint64
	size     int
	projects map[string]*projectLookups
	flight   singleflight.Group
}

// get answers the cached facts of (project, id), or reads them with load, once for all the
// callers that miss together.
func (c *sessionLookups) get(project, id string, now time.Time, load func() (sessionFacts, error)) (sessionFacts, error) {
	c.mu.RLock()
	if p := c.projects[project]; p != nil {
		if e, ok := p.sessions[id]; ok && now.Before(e.exp) {
			c.mu.RUnlock()
			return e.facts, nil
		}
	}
	c.mu.RUnlock()

	c.mu.Lock()
	if c.projects == nil {
		c.projects = map[string]*projectLookups{}
	}
	p := c.projects[project]
	if p == nil {
		p = &projectLookups{sessions: map[string]lookupEntry{}}
		c.projects[project] = p
	}
	gen, epoch := p.gen, c.epoch
	c.mu.Unlock()

	// A caller that arrives after a drop starts its own read rather than join one that began
	// before it.
	key := project + "\x00" + id + "\x00" + strconv.FormatUint(epoch, 10) + "." + strconv.FormatUint(gen, 10)
	v, err, _ := c.flight.Do(key, func() (any, error) {
		f, err := load()
		if err != nil {
			return f, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.epoch != epoch || p.gen != gen {
			return f, nil // dropped while reading: answer it, but do not keep it
		}
		if c.size >= maxLookups {
			c.flushLocked()
			return f, nil
		}
		if _, ok := p.sessions[id]; !ok {
			c.size++
		}
		p.sessions[id] = lookupEntry{facts: f, exp: now.Add(lookupTTL)}
		return f, nil
	})
	if err != nil {
		return sessionFacts{}, err
	}
	return v.(sessionFacts), nil
}

// forget drops what is cached of the project's sessions.
func (c *sessionLookups) forget(project string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.projects[project]; p != nil {
		p.gen++
		c.size -= len(p.sessions)
		clear(p.sessions)
	}
}

// flush drops everything.
func (c *sessionLookups) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
}

func (c *sessionLookups) flushLocked() {
	c.epoch++
	c.size = 0
	c.projects = map[string]*projectLookups{}
}

// lookupSession answers what ext_authz needs of session id of project: cached, or read.
func (s *Server) lookupSession(ctx context.Context, project, id string) (sessionFacts, error) {
	return s.access.lookups.get(project, id, s.Now(), func() (sessionFacts, error) {
		// One caller's cancelled request must not fail the others that joined its read.
		sess, err := s.Store.Get(context.WithoutCancel(ctx), project, id)
		if errors.Is(err, store.ErrNotFound) {
			return sessionFacts{}, nil
		}
		if err != nil {
			return sessionFacts{}, err
		}
		return sessionFacts{found: true, state: sess.State, nodeID: sess.NodeID}, nil
	})
}

// forgetSessions drops the cached lookups of project's sessions: this gateway changed one.
func (s *Server) forgetSessions(project string) { s.access.lookups.forget(project) }

// watchSessions drops cached lookups as the outbox signal stream names their projects, until
// ctx ends. Each (re)start of the tail flushes everything once the tail holds its position,
// since what changed before it is not in the tail.
func (s *Server) watchSessions(ctx context.Context) {
	after := ""
	for ctx.Err() == nil {
		sigs, next, err := s.Store.TailSignals(ctx, store.WorkOutbox, after, watchWait, 1000)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Warn("ext_authz: cannot tail session events; lookups are trusted for "+lookupTTL.String()+" only", "err", err)
			s.access.lookups.flush()
			after = ""
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if after == "" {
			s.access.lookups.flush()
		}
		for _, p := range store.SignalProjects(sigs) {
			s.access.lookups.forget(p)
		}
		after = next
	}
}
