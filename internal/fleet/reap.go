package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/oci"
	"wb/internal/datadir"
)

// reapGuests destroys every guest in a node's runtime state and removes its cgroups, through
// a driver on the same state as the node's own (cmd/wb newDriver: state and bundles in the
// data dir, cgroups under /wb/<id>-<digest>). A node stopped cleanly leaves its sessions'
// guests for its next start, and a killed one leaves them all: the fleet ends for good.
func reapGuests(ctx context.Context, runtime string, n *Node) error {
	var errs []error
	for _, l := range oci.Layouts(n.DataDir) {
		if _, err := os.Stat(l.StateRoot); errors.Is(err, os.ErrNotExist) {
			continue // never started a guest there
		}
		d, err := n.driver(runtime, l)
		if err != nil {
			return fmt.Errorf("fleet: reap %s's guests: %w", n.ID, err)
		}
		if err := reapOn(ctx, d, n); err != nil {
			errs = append(errs, err)
		}
	}
	// A guest cut off mid-start (a warm-pool refill when the node was stopped) leaves its
	// cgroup with no runtime state that List would show: every empty cgroup below the node's
	// goes, deepest first (rmdir removes only a cgroup with no process in it).
	if err := removeCgroupTree(n.CgroupParent()); err != nil {
		errs = append(errs, fmt.Errorf("fleet: %s's cgroups: %w", n.ID, err))
	}
	return errors.Join(errs...)
}

// reapOn destroys every guest of d, the driver on one of n's layouts.
func reapOn(ctx context.Context, d *oci.Driver, n *Node) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ids, err := d.List(ctx)
	if err != nil {
		return fmt.Errorf("fleet: reap %s's guests: %w", n.ID, err)
	}
	var errs []error
	for _, id := range ids {
		if err := d.Stop(ctx, id); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			errs = append(errs, fmt.Errorf("fleet: stop %s's guest %s: %w", n.ID, id, err))
		}
		if err := d.Delete(ctx, id); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			errs = append(errs, fmt.Errorf("fleet: delete %s's guest %s: %w", n.ID, id, err))
		}
	}
	return errors.Join(errs...)
}

// ServeNodeID is the id of the node `wb serve` runs (cmd/wb).
const ServeNodeID = "node_local"

// Reap destroys the guests of a node that will not start again, and removes its cgroups: what
// a test's `wb serve` or `wb node` leaves once stopped (cleanly, it leaves its sessions'
// guests for its next start; killed, all of them). runtime is the node's (runc or runsc),
// dataDir its --data-dir and id its id (ServeNodeID for `wb serve`).
func Reap(ctx context.Context, runtime, dataDir, id string) error {
	return reapGuests(ctx, runtime, &Node{ID: id, DataDir: dataDir})
}

// removeCgroupTree removes the cgroup p (and every cgroup below it) in each hierarchy: the
// v1 controllers mounted below /sys/fs/cgroup, and the v2 root itself.
func removeCgroupTree(p string) error {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	var errs []error
	for _, root := range roots {
		top := filepath.Join(root, p)
		if fi, err := os.Stat(top); err != nil || !fi.IsDir() {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(path string, de os.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Guests answers the ids of the guests in the node's runtime state (running or not), in
// each of its layouts.
func (f *Fleet) Guests(ctx context.Context, n *Node) ([]string, error) {
	var all []string
	for _, l := range oci.Layouts(n.DataDir) {
		if _, err := os.Stat(l.StateRoot); errors.Is(err, os.ErrNotExist) {
			continue
		}
		d, err := n.driver(f.opts.Runtime, l)
		if err != nil {
			return nil, fmt.Errorf("fleet: %s's guests: %w", n.ID, err)
		}
		ids, err := d.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("fleet: %s's guests: %w", n.ID, err)
		}
		all = append(all, ids...)
	}
	return all, nil
}

// driver is an OCI driver of runtime on one layout of the node's data dir (oci.Layouts,
// cmd/wb newDriver's) and its cgroups, for the fleet to see and reap its guests.
func (n *Node) driver(runtime string, l oci.Layout) (*oci.Driver, error) {
	return oci.New(oci.Options{Runtime: runtime, StateRoot: l.StateRoot, BundleRoot: l.BundleRoot, DiskTemplates: l.DiskTemplates,
		CgroupParent: n.CgroupParent(), Logger: slog.New(slog.DiscardHandler)})
}

// UnmountUnder detaches every mount below dir (guests' root file systems and disks), deepest
// first, so that removing dir cannot reach into a guest's files.
func UnmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// MountsOn counts the mounts on dir (a run dir's tmpfs: 1 while mounted, more when mounted
// over itself).
func MountsOn(dir string) (int, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n, nil
}

// CgroupParent is the cgroup below which the node's guests run (cmd/wb newDriver); it is
// gone once the node's guests are.
func (n *Node) CgroupParent() string { return "/wb/" + datadir.CgroupName(n.DataDir, n.ID) }
