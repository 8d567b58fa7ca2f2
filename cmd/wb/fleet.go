//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"wb/internal/fleet"
)

// fleetCmd is `wb fleet`: a whole fleet on this machine (internal/fleet) until SIGINT or
// SIGTERM, which stops it and leaves nothing behind.
func fleetCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wb fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "`dir` for everything the fleet writes, removed at the end (default: a new one under /tmp)")
	runtime := fs.String("runtime", "runc", "the nodes' guest `runtime`: runc or runsc")
	nodes := fs.Int("nodes", 3, "`number` of wb nodes")
	gateways := fs.Int("gateways", 2, "`number` of gateways")
	vcpu := fs.Int("vcpu", 8, "vCPUs each node offers to guests")
	mem := fs.Int("memory-mib", 16384, "memory (MiB) each node offers to guests")
	pool := fs.Int("pool", 1, "warm guests per template on each node")
	nodeTimeout := fs.Duration("node-timeout", 0, "how long a silent node lives on before its sessions fail with host_failure (default: wb serve's)")
	tls := fs.Bool("tls", false, "mutual TLS inside the fleet: mint a throwaway CA and certificates of the node, gateway and Envoy roles into DIR/tls, and run the nodes and gateways with --fleet-tls-* (the gateways' public listeners stay plaintext)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: wb fleet [flags]

Starts a fleet on this machine, on loopback: a Redis Cluster of 3 primaries and 3 replicas,
wb nodes each with a data dir of its own, and gateways (wb serve --runtime none) that share
it; snapshots go to a file:// object store every node reaches. Prints, for eval:
  WB_URL=...        (the first gateway)
  WB_URLS=...,...   (every gateway)
  WB_API_KEY=...    WB_ADMIN_KEY=...
SIGINT (Ctrl-C) or SIGTERM stops everything and removes every guest and the dir.
Needs root, redis-server and redis-cli, runc (or runsc), busybox, and wb-agent beside wb.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("wb fleet takes no arguments, got %q", fs.Args())
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if *dir == "" {
		// Short: the guests' Unix socket paths live below it.
		if *dir, err = os.MkdirTemp("", "wbf"); err != nil {
			return err
		}
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	fl, err := fleet.Start(startCtx, fleet.Options{Dir: *dir, Bin: self, Runtime: *runtime, Nodes: *nodes, Gateways: *gateways,
		NodeVCPU: *vcpu, NodeMemoryMiB: *mem, Pool: *pool, NodeTimeout: *nodeTimeout, TLS: *tls, Logf: logf})
	cancel()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "WB_URL=%s\nWB_URLS=%s\nWB_API_KEY=%s\nWB_ADMIN_KEY=%s\n", fl.GatewayURLs[0],
		strings.Join(fl.GatewayURLs, ","), fl.APIKey, fl.AdminKey)
	if fl.TLSDir != "" {
		logf("fleet: mutual TLS inside the fleet; its CA and certificates (an Envoy's: envoy.pem) are in %s", fl.TLSDir)
	}
	logf("fleet: ready in %s; Ctrl-C stops it", *dir)
	<-ctx.Done()
	logf("fleet: stopping")
	if err := fl.Stop(context.Background()); err != nil {
		return err
	}
	logf("fleet: stopped; nothing left")
	return nil
}
