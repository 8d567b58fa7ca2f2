package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestCrossBuild: wb is also the callers' CLI and package client their Go SDK, so both must
// build for the machines callers run them on, macOS and Windows, where the commands that
// need Linux answer so (commands_other.go); and their tests must compile there, for go vet
// and go test. Nothing else builds wb for those systems: Linux-only calls in packages the
// CLI imported went unnoticed until a Mac's go install failed. darwin/arm64 stands for
// darwin/amd64 too: the code differs by system, not by processor.
func TestCrossBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks wb, its tests and its dependencies for two more systems: 5-15 s each")
	}
	for _, target := range []struct{ goos, goarch string }{{"darwin", "arm64"}, {"windows", "amd64"}} {
		t.Run(target.goos+"_"+target.goarch, func(t *testing.T) {
			start := time.Now()
			errs, n := typeCheckFor(t, target.goos, target.goarch, "wb/cmd/wb", "wb/internal/cli", "wb/client/...")
			t.Logf("%d packages in %s", n, time.Since(start).Round(time.Millisecond))
			for _, err := range errs {
				t.Errorf("GOOS=%s GOARCH=%s: %v", target.goos, target.goarch, err)
			}
		})
	}
}

// typeCheckFor type-checks the packages of patterns, their tests and every package they
// import, as the compiler would build them for goos/goarch without cgo (the files go list
// selects), from source with go/types: the compiler's errors without its code generation,
// which made a cold go build of wb for darwin/arm64 take three minutes here (what it does not
// see: the linker's errors, and a function whose assembly is missing on that system). It
// returns the errors (ten at most per package, none for a package whose import failed) and
// how many packages it checked.
func typeCheckFor(t *testing.T, goos, goarch string, patterns ...string) ([]error, int) {
	t.Helper()
	goTool, err := exec.LookPath("go") // go test puts its own go first in $PATH
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	type goError struct{ Err string }
	type listed struct {
		ImportPath string
		Standard   bool
		Dir        string
		GoFiles    []string
		Imports    []string
		ImportMap  map[string]string
		Error      *goError

		pkg  *types.Package // nil until checked, and when it did not check
		done chan struct{}  // closed once checked
	}
	args := append([]string{"list", "-e", "-deps", "-test", "-json=ImportPath,Standard,Dir,GoFiles,Imports,ImportMap,Error"}, patterns...)
	cmd := exec.CommandContext(t.Context(), goTool, args...)
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("GOOS=%s GOARCH=%s go %v: %v\n%s", goos, goarch, args, err, stderr.Bytes())
	}
	var pkgs []*listed
	byPath := map[string]*listed{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		p := &listed{done: make(chan struct{})}
		if err := dec.Decode(p); err != nil {
			t.Fatalf("go list's output: %v", err)
		}
		pkgs = append(pkgs, p)
		byPath[p.ImportPath] = p
	}

	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	fset := token.NewFileSet()
	sizes := types.SizesFor("gc", goarch)
	cpus := make(chan struct{}, runtime.GOMAXPROCS(0))
	for _, p := range pkgs {
		wg.Go(func() {
			defer close(p.done)
			var pkgErrs []error
			defer func() {
				mu.Lock()
				errs = append(errs, pkgErrs...)
				mu.Unlock()
			}()
			if p.Error != nil {
				pkgErrs = append(pkgErrs, fmt.Errorf("%s: %s", p.ImportPath, p.Error.Err))
				return
			}
			// Its imports first, each checked or failed, before taking a CPU: a package
			// holding one while it waits could starve the ones it waits for. One that
			// failed fails this one without more errors, as go build reports them.
			for _, imp := range p.Imports {
				if dep := byPath[imp]; dep != nil {
					if <-dep.done; dep.pkg == nil {
						return
					}
				}
			}
			cpus <- struct{}{}
			defer func() { <-cpus }()
			var files []*ast.File
			for _, name := range p.GoFiles {
				if !filepath.IsAbs(name) { // a test binary's generated main is not in Dir
					name = filepath.Join(p.Dir, name)
				}
				f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
				if err != nil {
					pkgErrs = append(pkgErrs, err)
					return
				}
				files = append(files, f)
			}
			conf := types.Config{
				// The standard library builds for every port of each Go release: its
				// declarations are what the rest needs.
				IgnoreFuncBodies: p.Standard,
				Sizes:            sizes,
				Importer: importerFunc(func(path string) (*types.Package, error) {
					if path == "unsafe" {
						return types.Unsafe, nil
					}
					if mapped, ok := p.ImportMap[path]; ok {
						path = mapped
					}
					if dep := byPath[path]; dep != nil && dep.pkg != nil {
						return dep.pkg, nil
					}
					return nil, fmt.Errorf("%s is not among go list's packages", path)
				}),
				Error: func(err error) {
					if len(pkgErrs) < 10 {
						pkgErrs = append(pkgErrs, err)
					}
				},
			}
			pkg, _ := conf.Check(p.ImportPath, fset, files, nil)
			if len(pkgErrs) == 0 {
				p.pkg = pkg
			}
		})
	}
	wg.Wait()
	return errs, len(pkgs)
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
