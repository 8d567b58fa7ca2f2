package plugins

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tetratelabs/wazero"

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
	cacheDir string // compilation cache shared by the tests' hosts, warmed by TestMain
)

func TestMain(m *testing.M) {
	flag.Parse()
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
	start := time.Now()
	paths, err := buildGuests(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	built := time.Now()
	// Every Go guest compiled once, before any test and under no test's deadline: a cold
	// compile of one takes a minute or more in a race-instrumented binary on a slow machine.
	if err := warmCache(cacheDir, paths); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "plugins tests: guests built in %s, compiled in %s\n",
			built.Sub(start).Round(time.Millisecond), time.Since(built).Round(time.Millisecond))
	}
	return m.Run()
}

// buildGuests builds every Go guest with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared (one
// package per go build: c-shared takes one main package), and answers the files' paths.
func buildGuests(dir string) ([]string, error) {
	gobin, err := goCommand()
	if err != nil {
		return nil, err
	}
	var (
		mu    sync.Mutex
		errs  []error
		paths []string
		wg    sync.WaitGroup
	)
	// The first build compiles the wasip1 standard library into the build cache alone; the
	// others, started together on a cold cache, would each compile it again.
	first := true
	for name, pkg := range guestDirs {
		build := func() {
			out := filepath.Join(dir, name+".wasm")
			cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-trimpath", "-o", out, pkg)
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
			b, err := cmd.CombinedOutput()
			if err != nil {
				err = fmt.Errorf("build %s: %w\n%s", pkg, err, b)
			} else {
				b, err = os.ReadFile(out)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			guests[name] = b
			paths = append(paths, out)
		}
		if first {
			first = false
			build()
			continue
		}
		wg.Go(build)
	}
	wg.Wait()
	return paths, errors.Join(errs...)
}

// warmCache compiles the modules into dir with testdata/warmcache, a program built without
// -race: wazero's compiler runs several times faster there, and the code it writes is the
// same. The tests' hosts then load it from dir.
func warmCache(dir string, wasm []string) error {
	gobin, err := goCommand()
	if err != nil {
		return err
	}
	version, err := wazeroVersion(dir)
	if err != nil {
		return err
	}
	// wazero files its cache under its version and checks it in every entry. A test binary
	// carries no module versions, so its wazero says "dev"; the program must say the same,
	// through the variable wazero's own CLI sets this way.
	args := []string{"run", "-ldflags=-X github.com/tetratelabs/wazero/internal/version.version=" + version,
		"./testdata/warmcache", dir}
	cmd := exec.Command(gobin, append(args, wasm...)...)
	// Static like `make test`'s wb, which holds wazero: the build reuses its compiled packages.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("compile the guests into %s: %w\n%s", dir, err, b)
	}
	return nil
}

// wazeroVersion answers the version wazero reports in this binary, read from the name of
// the subdirectory that a compilation cache makes in dir: wazero-VERSION-GOARCH-GOOS.
func wazeroVersion(dir string) (string, error) {
	ctx := context.Background()
	c, err := wazero.NewCompilationCacheWithDir(dir)
	if err != nil {
		return "", err
	}
	if err := c.Close(ctx); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	suffix := "-" + runtime.GOARCH + "-" + runtime.GOOS
	for _, e := range entries {
		if v, ok := strings.CutPrefix(e.Name(), "wazero-"); ok && strings.HasSuffix(v, suffix) {
			return strings.TrimSuffix(v, suffix), nil
		}
	}
	return "", fmt.Errorf("no wazero-VERSION%s directory in %s", suffix, dir)
}

func goCommand() (string, error) {
	gobin, err := exec.LookPath("go")
	if err == nil {
		return gobin, nil
	}
	gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		return "", fmt.Errorf("no go command to build the guests: %w", err)
	}
	return gobin, nil
}

// logSink collects the host's log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
	on    func(msg string)
	// onLine sees each line as text() has it (message and attributes); a panic in it fails
	// the wb.log call that logged the line, as a trap.
	onLine func(line string)
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
	on, onLine := s.on, s.onLine
	s.mu.Unlock()
	if on != nil {
		on(r.Message)
	}
	if onLine != nil {
		onLine(b.String())
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
	if o.Timeout == 0 {
		// A call's deadline where it is not the point: a cold make test's decide of a
		// constant plugin ran past the default 20 ms (TestForget). The tests of the
		// deadline give their hosts DefaultTimeout.
		o.Timeout = MaxTimeout
	}
	if o.InitTimeout == 0 {
		// A Go guest's _initialize takes milliseconds, but a race-instrumented wazero on a
		// loaded 2-core machine ran past the default 1 s (CI failed TestNoLeak so). The
		// deadline itself is tested with its own host in TestValidate.
		o.InitTimeout = 30 * time.Second
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

// ctxT is the context of a test's calls. It ends a little before the test binary's -timeout
// would stop everything (so that a stuck call fails its own test, with a message), not at a
// fixed figure that a slow machine can reach: TestMain compiled the Go guests, and a test's
// own calls are quick.
func ctxT(t testing.TB) context.Context {
	d := time.Now().Add(10 * time.Minute)
	if tt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := tt.Deadline(); ok {
			d = end.Add(-time.Until(end) / 20)
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), d)
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
