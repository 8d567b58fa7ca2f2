package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"wb/session"
)

// ProjectsKey is the set of every project id; consumers of per-project streams walk it.
const ProjectsKey = "wb:projects"

// Project is a tenant and its plan's limits.
type Project struct {
	ID   string `json:"project_id"`
	Name string `json:"name"`
	// Concurrency is the number of sessions that may be active at once.
	Concurrency int `json:"concurrency"`
	// RatePerSec and Burst bound the project's request rate on admission.
	RatePerSec int `json:"rate_per_sec"`
	Burst      int `json:"burst"`
}

// Plan defaults for a new project.
const (
	DefaultConcurrency = 100
	DefaultRatePerSec  = 100
	DefaultBurst       = 200
)

// ErrBadKey: the API key is unknown.
var ErrBadKey = errors.New("unknown API key")

func apiKeyKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "wb:apikey:" + hex.EncodeToString(sum[:])
}

func projectKey(id string) string { return projectKeys(id).p + "project" }

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
	p := Project{ID: session.NewID("proj_", s.now()), Name: name,
		Concurrency: DefaultConcurrency, RatePerSec: DefaultRatePerSec, Burst: DefaultBurst}
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
		pl.HSet(ctx, projectKey(p.ID), "name", p.Name, "concurrency", p.Concurrency, "rate", p.RatePerSec, "burst", p.Burst)
		pl.SAdd(ctx, ProjectsKey, p.ID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("write project %s: %w", p.ID, err)
	}
	return nil
}

// AddAPIKey binds key to project.
func (s *Store) AddAPIKey(ctx context.Context, project, key string) error {
	if err := s.rdb.Set(ctx, apiKeyKey(key), project, 0).Err(); err != nil {
		return fmt.Errorf("store API key: %w", err)
	}
	return nil
}

// Authenticate returns the project that key belongs to, or ErrBadKey.
func (s *Store) Authenticate(ctx context.Context, key string) (Project, error) {
	id, err := s.rdb.Get(ctx, apiKeyKey(key)).Result()
	if errors.Is(err, redis.Nil) {
		return Project{}, ErrBadKey
	}
	if err != nil {
		return Project{}, fmt.Errorf("authenticate: %w", err)
	}
	return s.GetProject(ctx, id)
}

// GetProject reads a project and its limits.
func (s *Store) GetProject(ctx context.Context, id string) (Project, error) {
	m, err := s.rdb.HGetAll(ctx, projectKey(id)).Result()
	if err != nil {
		return Project{}, fmt.Errorf("get project %s: %w", id, err)
	}
	if len(m) == 0 {
		return Project{}, ErrNotFound
	}
	atoi := func(k string) int { v, _ := strconv.Atoi(m[k]); return v }
	return Project{ID: id, Name: m["name"], Concurrency: atoi("concurrency"), RatePerSec: atoi("rate"), Burst: atoi("burst")}, nil
}

// SetConcurrency changes a project's concurrency limit.
func (s *Store) SetConcurrency(ctx context.Context, id string, n int) error {
	if n < 0 || n > 100000 {
		return &session.FieldError{Field: "concurrency", Message: fmt.Sprintf("must be 0–100000, got %d", n)}
	}
	return s.rdb.HSet(ctx, projectKey(id), "concurrency", n).Err()
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
	p = Project{ID: id, Name: name, Concurrency: DefaultConcurrency, RatePerSec: DefaultRatePerSec, Burst: DefaultBurst}
	return p, s.putProject(ctx, p)
}

// SetRate changes a project's admission rate (per second) and burst.
func (s *Store) SetRate(ctx context.Context, id string, rate, burst int) error {
	if rate < 0 || burst < 1 {
		return &session.FieldError{Field: "rate_per_sec", Message: "rate must be ≥ 0 and burst ≥ 1"}
	}
	return s.rdb.HSet(ctx, projectKey(id), "rate", rate, "burst", burst).Err()
}
