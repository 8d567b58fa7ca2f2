package store

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// Project is a tenant and the limits in force for it.
type Project struct {
	ID   string `json:"project_id"`
	Name string `json:"name"`
	// Plan holds the limits in force: the operator's plan, lowered where the tenant chose to.
	Plan
	// Granted is the operator's plan as set (PUT /v1/admin/projects/{id}/plan).
	Granted Plan `json:"-"`
}

// Plan defaults for a new project.
const (
	DefaultConcurrency   = 100
	DefaultRatePerSec    = 100
	DefaultBurst         = 200
	DefaultSnapshotCount = 100
	DefaultSnapshotGiB   = 50
	// DefaultNodeSharePct keeps one project from filling a node on its own.
	DefaultNodeSharePct = 50
)

// ErrBadKey: the API key is unknown.
var ErrBadKey = errors.New("unknown API key")

// NewAPIKey returns a fresh random key with the given prefix ("wb_live_", "wb_admin_").
func NewAPIKey(prefix string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// CreateProject makes a project with the default plan and one API key, which is returned
// once and stored only as its SHA-256.
func (s *Store) CreateProject(ctx context.Context, name string) (Project, string, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 100 {
		return Project{}, "", &session.FieldError{Field: "name", Message: "is required, 1–100 characters"}
	}
	p := Project{ID: session.NewID("proj_", s.now()), Name: name, Plan: DefaultPlan(), Granted: DefaultPlan()}
	key := NewAPIKey("wb_live_")
	if err := s.putProject(ctx, p); err != nil {
		return Project{}, "", err
	}
	if err := s.AddAPIKey(ctx, p.ID, key); err != nil {
		return Project{}, "", err
	}
	return p, key, nil
}

func (s *Store) putProject(ctx context.Context, p Project) error {
	_, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		pl.HSet(ctx, ProjectKeys(p.ID).project(), append([]any{"name", p.Name}, p.Granted.hashArgs()...)...)
		pl.SAdd(ctx, ProjectsKey, p.ID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("write project %s: %w", p.ID, err)
	}
	return nil
}

// KeyPrefix is the part of an API key that may be shown and names it to RevokeAPIKey: its
// first 16 characters ("wb_live_" and 8 random ones: enough to tell a project's keys apart,
// far too few to guess the other 24), or the first half of a shorter key.
func KeyPrefix(key string) string { return key[:min(16, len(key)/2)] }

// AddAPIKey binds key to project. A new key is in no gateway's cache: nothing to announce.
func (s *Store) AddAPIKey(ctx context.Context, project, key string) error {
	sum := apiKeyHash(key)
	// The index first: a key that works is always one that can be revoked. The two keys are
	// in different Cluster slots, so they cannot be one transaction.
	if err := s.rdb.HSet(ctx, ProjectKeys(project).apiKeys(), KeyPrefix(key), sum).Err(); err != nil {
		return fmt.Errorf("index API key of %s: %w", project, err)
	}
	if err := s.rdb.Set(ctx, apiKeyHashKey(sum), project, 0).Err(); err != nil {
		return fmt.Errorf("store API key of %s: %w", project, err)
	}
	return nil
}

// RevokeAPIKey deletes the project's API key whose KeyPrefix is prefix, then waits until
// every gateway has dropped it (Changes.Publish). ErrNotFound if the project has no such key.
func (s *Store) RevokeAPIKey(ctx context.Context, project, prefix string) error {
	idx := ProjectKeys(project).apiKeys()
	sum, err := s.rdb.HGet(ctx, idx, prefix).Result()
	if errors.Is(err, redis.Nil) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("revoke API key of %s: %w", project, err)
	}
	// A key is bound to one project for ever: delete it only if it is this one's.
	owner, err := s.rdb.Get(ctx, apiKeyHashKey(sum)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("revoke API key of %s: %w", project, err)
	}
	if owner == project {
		if err := s.rdb.Del(ctx, apiKeyHashKey(sum)).Err(); err != nil {
			return fmt.Errorf("revoke API key of %s: %w", project, err)
		}
	}
	if err := s.rdb.HDel(ctx, idx, prefix).Err(); err != nil {
		return fmt.Errorf("revoke API key of %s: %w", project, err)
	}
	s.changes.Publish(ctx, project, ChangeKeys)
	return nil
}

// Authenticate returns the project that key belongs to, or ErrBadKey.
//
// A key made before the project's keys were indexed by prefix (AddAPIKey) has no entry in
// the index, and its prefix cannot be derived from its hash: the key is indexed here, where
// it is at hand, so that a key in use can always be revoked (RevokeAPIKey). HSETNX keeps an
// existing entry, and shares the project read's round trip (one hash slot, {project}).
func (s *Store) Authenticate(ctx context.Context, key string) (Project, error) {
	sum := apiKeyHash(key)
	id, err := s.rdb.Get(ctx, apiKeyHashKey(sum)).Result()
	if errors.Is(err, redis.Nil) {
		return Project{}, ErrBadKey
	}
	if err != nil {
		return Project{}, fmt.Errorf("authenticate: %w", err)
	}
	var get *redis.MapStringStringCmd
	if _, err := s.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		get = pl.HGetAll(ctx, ProjectKeys(id).project())
		pl.HSetNX(ctx, ProjectKeys(id).apiKeys(), KeyPrefix(key), sum)
		return nil
	}); err != nil {
		return Project{}, fmt.Errorf("get project %s: %w", id, err)
	}
	return projectFromHash(id, get.Val())
}

// GetProject reads a project and its limits.
func (s *Store) GetProject(ctx context.Context, id string) (Project, error) {
	m, err := s.rdb.HGetAll(ctx, ProjectKeys(id).project()).Result()
	if err != nil {
		return Project{}, fmt.Errorf("get project %s: %w", id, err)
	}
	return projectFromHash(id, m)
}

// projectFromHash reads project id from its hash (ErrNotFound when empty).
func projectFromHash(id string, m map[string]string) (Project, error) {
	if len(m) == 0 {
		return Project{}, ErrNotFound
	}
	granted, inForce := planFromHash(m)
	return Project{ID: id, Name: m["name"], Plan: inForce, Granted: granted}, nil
}

// SetConcurrency changes a project's plan concurrency (an operator's setting).
func (s *Store) SetConcurrency(ctx context.Context, id string, n int) error {
	return s.SetPlan(ctx, id, PlanChange{Concurrency: &n})
}

// Projects lists every project id.
func (s *Store) Projects(ctx context.Context) ([]string, error) {
	return s.rdb.SMembers(ctx, ProjectsKey).Result()
}

// EnsureProject creates project id with name and the default plan if it does not exist.
func (s *Store) EnsureProject(ctx context.Context, id, name string) (Project, error) {
	p, err := s.GetProject(ctx, id)
	if err == nil {
		return p, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return p, err
	}
	p = Project{ID: id, Name: name, Plan: DefaultPlan(), Granted: DefaultPlan()}
	return p, s.putProject(ctx, p)
}

// SetRate changes a project's plan rate (creates per second) and burst (an operator's setting).
func (s *Store) SetRate(ctx context.Context, id string, rate, burst int) error {
	return s.SetPlan(ctx, id, PlanChange{RatePerSec: &rate, Burst: &burst})
}
