package gateway

import (
	"context"
	"sync"
	"time"

	"wb/store"
)

// What the gateway keeps of a project instead of reading it for every request: the project
// and plan behind each API key (authCache), its policies (policies.Engine) and its plugins
// (plugins.Host). What it keeps of a project is dropped:
//
//   - on every gateway before the write that changed it answers: the write announces the
//     project on store.Changes and waits until each subscribed gateway has acknowledged
//     dropping it (watchChanges), so the next request anywhere reads the new configuration;
//   - all at once whenever the subscription is made again (at start, after a lost connection
//     or a Redis failover), since what was announced meanwhile was lost; while it is down
//     authCache trusts nothing it holds (the policies' and plugins' own refresh, every
//     second, stands in for theirs);
//   - and after authTTL in any case: only a belt, for an announcement lost without anyone
//     noticing (a gateway that did not acknowledge within store.DefaultChangeWait is logged
//     by the writer).

// authTTL bounds how long a key → project lookup is trusted without an announcement.
const authTTL = 60 * time.Second

// maxAuthEntries bounds authCache; past it everything is dropped and read again.
const maxAuthEntries = 10_000

// changesStartWait bounds how long New waits for its first subscription, so that requests
// use the caches from the start (it takes a round trip). A Redis that refuses connections
// does not hold New that long: the failed subscription ends the wait too.
const changesStartWait = 5 * time.Second

type authEntry struct {
	p   store.Project
	exp time.Time
}

// authCache keeps key → project lookups. gen counts drops, so that a read that began before
// one does not store what it read after it. Its zero value holds nothing and is not live.
type authCache struct {
	mu   sync.Mutex
	live bool // subscribed to store.Changes: what is kept may be trusted
	gen  uint64
	m    map[string]authEntry
}

// get answers the project of key, if kept and trusted, and the generation to hand put.
func (c *authCache) get(key string, now time.Time) (store.Project, bool, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok && c.live && now.Before(e.exp) {
		return e.p, true, c.gen
	}
	return store.Project{}, false, c.gen
}

// put keeps key's project, read since get answered gen, unless something was dropped since.
func (c *authCache) put(key string, p store.Project, now time.Time, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || c.gen != gen {
		return
	}
	if c.m == nil || len(c.m) >= maxAuthEntries {
		c.m = map[string]authEntry{}
	}
	c.m[key] = authEntry{p, now.Add(authTTL)}
}

// forget drops the lookups of project's keys.
func (c *authCache) forget(project string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for k, e := range c.m {
		if e.p.ID == project {
			delete(c.m, k)
		}
	}
}

// reset drops everything and says whether what is kept from now on may be trusted.
func (c *authCache) reset(live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.live = live
	clear(c.m)
}

// watchChanges follows store.Changes until ctx ends, and waits (changesStartWait at most)
// for the first subscription.
func (s *Server) watchChanges(ctx context.Context) {
	first := make(chan struct{})
	var once sync.Once
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.Store.Changes().Watch(ctx, store.ChangeWatch{
			Changed: s.projectChanged,
			Live: func(live bool) {
				s.changesLive(live)
				once.Do(func() { close(first) })
			},
		})
	}()
	select {
	case <-first:
	case <-time.After(changesStartWait):
	}
}

// changesLive is told whether the subscription holds. Either way what is kept is dropped: a
// change may have been missed.
func (s *Server) changesLive(live bool) {
	s.auth.reset(live)
	if !live {
		return // store.Changes logs why
	}
	if s.Policies != nil {
		s.Policies.ForgetAll()
	}
	if s.Plugins != nil {
		s.Plugins.ForgetAll()
	}
}

// projectChanged drops what this gateway keeps of the project that c names (of every project
// when it names none).
func (s *Server) projectChanged(c store.ProjectChange) {
	auth, pol, plug := true, true, true
	switch c.Kind {
	case store.ChangeKeys, store.ChangePlan:
		pol, plug = false, false
	case store.ChangePolicies:
		auth, plug = false, false
	case store.ChangePlugins:
		auth, pol = false, false
	}
	if c.Project == "" {
		auth, pol, plug = true, true, true
	}
	if auth {
		if c.Project == "" {
			s.auth.reset(true)
		} else {
			s.auth.forget(c.Project)
		}
	}
	if pol && s.Policies != nil {
		if c.Project == "" {
			s.Policies.ForgetAll()
		} else {
			s.Policies.Forget(c.Project)
		}
	}
	if plug && s.Plugins != nil {
		if c.Project == "" {
			s.Plugins.ForgetAll()
		} else {
			s.Plugins.Forget(c.Project)
		}
	}
}
