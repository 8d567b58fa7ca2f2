package plugins

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/redistest"
	"wb/session"
)

// Go guests built from source by TestMain: the examples and the test guests.
var (
	guestDirs = map[string]string{
		"allowlist":   "./examples/allowlist",
		"tiercap":     "./examples/tiercap",
		"requiremeta": "./examples/requiremeta",
		"noop":        "./testdata/guests/noop",
		"hostile":     "./testdata/guests/hostile",
		"rawgo":       "./testdata/guests/rawgo",
	}
	guests   = map[string][]byte{}
	cacheDir string // compilation cache shared by the tests' hosts
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "wb-plugins-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cacheDir = filepath.Join(dir, "cache")
	if err := buildGuests(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// buildGuests builds every Go guest with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared.
func buildGuests(dir string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, err := os.Stat(gobin); err != nil {
			return fmt.Errorf("no go command to build the guests: %w", err)
		}
	}
	for name, pkg := range guestDirs {
		out := filepath.Join(dir, name+".wasm")
		cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-trimpath", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", pkg, err, b)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			return err
		}
		guests[name] = b
	}
	return nil
}

// logSink collects the host's log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
	on    func(msg string)
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	s.mu.Lock()
	s.lines = append(s.lines, b.String())
	on := s.on
	s.mu.Unlock()
	if on != nil {
		on(r.Message)
	}
	return nil
}
func (s *logSink) WithAttrs([]slog.Attr) slog.Handler { return s }
func (s *logSink) WithGroup(string) slog.Handler      { return s }

func (s *logSink) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

func newTestHost(t testing.TB, rdb redis.UniversalClient, o Options) (*Host, *logSink) {
	t.Helper()
	sink := &logSink{}
	if o.Logger == nil {
		o.Logger = slog.New(sink)
	}
	if o.CacheDir == "" {
		o.CacheDir = cacheDir
	}
	h, err := NewHost(context.Background(), rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return h, sink
}

func mini(t testing.TB) redis.UniversalClient {
	c, _ := redistest.Mini(t)
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func intp(v int) *int { return &v }

// admission answers the JSON input of an admission.
func admission(t testing.TB, req session.CreateRequest) []byte {
	t.Helper()
	b, err := Admission(session.AdmissionInput{Request: req, ProjectID: "p", Plan: session.Plan{Concurrency: 10, RatePerSec: 5}, Active: 2},
		time.UnixMilli(1_700_000_000_000)).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustPut(t testing.TB, h *Host, project, name string, wasm []byte, order int, failOpen bool, opts ...Option) Plugin {
	t.Helper()
	p, err := h.Put(ctxT(t), project, name, wasm, []string{session.PointAdmission}, order, failOpen, opts...)
	if err != nil {
		t.Fatalf("put %s: %v", name, err)
	}
	return p
}

func decide(t testing.TB, h *Host, project string, input []byte) []session.Decision {
	t.Helper()
	ds, err := h.Decide(context.Background(), project, session.PointAdmission, input)
	if err != nil {
		t.Fatalf("decide %s: %v", project, err)
	}
	return ds
}

func one(t testing.TB, ds []session.Decision) session.Decision {
	t.Helper()
	if len(ds) != 1 {
		t.Fatalf("want 1 decision, got %+v", ds)
	}
	return ds[0]
}
