// Command warmcache compiles wasm modules into a wazero compilation cache directory, as
// plugins.Host compiles them: the module the host rewrites (its tables' and stack's bounds)
// under the runtime settings that change the cache key (close on context done, which makes
// the compiler insert termination checks). It validates each module with a Host of its own.
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
	"log/slog"
	"os"
	"sync"
	"time"

	"wb/plugins"
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
	h, err := plugins.NewHost(ctx, nil, plugins.Options{CacheDir: args[0], InitTimeout: time.Minute,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer h.Close(ctx)
	// The host compiles one module at a time; the reads and checks run side by side.
	errs := make([]error, len(args)-1)
	var wg sync.WaitGroup
	for i, path := range args[1:] {
		wg.Go(func() {
			wasm, err := os.ReadFile(path)
			if err == nil {
				_, err = h.Validate(ctx, wasm)
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
