//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"wb/internal/fleet"
)

// loadOnFleet starts a fleet, runs body against all its gateways (checking the nodes' guests
// too), and stops it. No warm pool: every guest a node has after a run is a leak.
func loadOnFleet(ctx context.Context, o loadOpts, stderr io.Writer, body func(loadOpts, redis.UniversalClient, guestLister) error) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir := o.fleetDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "wbl"); err != nil {
			return err
		}
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	fl, err := fleet.Start(startCtx, fleet.Options{Dir: dir, Bin: self, Runtime: o.fleetRuntime, Pool: 0, Logf: logf})
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		if err := fl.Stop(context.WithoutCancel(ctx)); err != nil {
			logf("load: stop the fleet: %v", err)
		}
	}()
	o.urls, o.key = fl.GatewayURLs, fl.APIKey
	guests := func(ctx context.Context) (map[string][]string, error) {
		out := map[string][]string{}
		var errs []error
		for _, n := range fl.Nodes {
			ids, err := fl.Guests(ctx, n)
			if err != nil {
				errs = append(errs, err)
			}
			out[n.ID] = ids
		}
		return out, errors.Join(errs...)
	}
	logf("load: fleet ready; %s at %g flows/s on %d gateways", o.duration, o.rate, len(o.urls))
	err = body(o, fl.Redis, guests)
	if err != nil {
		logf("%s", fl.Logs())
	}
	return err
}
