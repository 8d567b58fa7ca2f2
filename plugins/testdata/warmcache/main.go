// Command warmcache compiles wasm modules into a wazero compilation cache directory, with the
// runtime settings of plugins.Host that change the cache key (close on context done, which
// makes the compiler insert termination checks).
//
// The plugins tests run it before their first test: built without -race, wazero compiles a Go
// guest several times faster than inside the race-instrumented test binary, and the tests'
// hosts then load the compiled code from the directory. A module whose key differs (the host's
// settings changed) is compiled again by the host: slower, never wrong.
//
// Usage: warmcache DIR MODULE.wasm...
package main

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/tetratelabs/wazero"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "warmcache:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("usage: warmcache DIR MODULE.wasm...")
	}
	cache, err := wazero.NewCompilationCacheWithDir(args[0])
	if err != nil {
		return fmt.Errorf("cache %s: %w", args[0], err)
	}
	defer cache.Close(ctx)
	cfg := wazero.NewRuntimeConfig().WithCloseOnContextDone(true).WithCompilationCache(cache).WithDebugInfoEnabled(false)
	r := wazero.NewRuntimeWithConfig(ctx, cfg)
	defer r.Close(ctx)
	// One module per goroutine: the compiler is single-threaded per module.
	errs := make([]error, len(args)-1)
	var wg sync.WaitGroup
	for i, path := range args[1:] {
		wg.Go(func() {
			wasm, err := os.ReadFile(path)
			if err == nil {
				_, err = r.CompileModule(ctx, wasm)
			}
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", path, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
