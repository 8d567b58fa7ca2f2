package main

import (
	"debug/elf"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"wb/hypervisor/oci"
	"wb/hypervisor/templates"
	"wb/node"
	"wb/session"
	"wb/store"
)

// startNode builds the templates and the embedded node of `wb serve`. With --runtime none it
// answers a catalog without guests: sessions are admitted and stay pending.
func startNode(f serveFlags, st *store.Store, log *slog.Logger) (*node.Node, session.Catalog, error) {
	tplDir := filepath.Join(f.dataDir, "templates")
	cat, err := templates.Assemble(tplDir)
	if err != nil {
		return nil, nil, fmt.Errorf("templates in %s: %w", tplDir, err)
	}
	if f.runtime == "none" {
		return nil, node.CatalogOf(cat), nil
	}
	rt := f.runtime
	if rt == "auto" {
		rt = ""
	}
	drv, err := oci.New(oci.Options{Runtime: rt, BundleRoot: filepath.Join(f.dataDir, "bundles"), Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("--runtime %s: %w (install runsc or runc, or pass --runtime none)", f.runtime, err)
	}
	self, err := agentBinary()
	if err != nil {
		return nil, nil, err
	}
	var pools []node.Pool
	if f.pool > 0 {
		for _, name := range cat.Names() {
			pools = append(pools, node.Pool{Template: name, SizeClass: "s", Size: f.pool})
		}
	}
	nd, err := node.New(node.Config{
		Store: st, Driver: drv, Templates: cat, DataDir: filepath.Join(f.dataDir, "node"), AgentBin: self,
		Info: store.NodeInfo{ID: "node_local", Addr: "in-process", Region: f.region, Zone: f.region + "-a",
			Tiers: []int{1, 2, 3, 4}, VCPU: 64, MemoryMiB: 1 << 20},
		Pools: pools, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	log.Info("node ready", "runtime", drv.Name(), "templates", cat.Names())
	return nd, nd.Catalog(), nil
}

// agentBinary is this executable, which must be static to run inside a bare guest.
func agentBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	f, err := elf.Open(self)
	if err != nil {
		return "", fmt.Errorf("inspect %s: %w", self, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked; guests need a static wb: build with CGO_ENABLED=0 (make build does)", self)
		}
	}
	return self, nil
}
