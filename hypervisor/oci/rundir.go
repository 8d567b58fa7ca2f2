package oci

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"wb/hypervisor"
)

// RunDirBytes bounds the tmpfs of a data dir's runtime state and bundles (OpenDataDir). A
// guest keeps about 60 KiB there (its config.json, guest.json and the runtime's state; its
// console log has a tmpfs of its own, its disk stays on the data dir's disk): 64 MiB is
// room for about a thousand guests. Full, a guest's start fails naming this dir, and the
// guests already there run and end as before (removing one frees its room).
const RunDirBytes = 64 << 20

// Layout is where a driver on a node's data dir keeps the runtime's state (StateRoot), the
// guests' bundles (BundleRoot) and its disk templates. RunDir is the tmpfs that holds the
// first two, or "" when they are on the data dir's own file system.
type Layout struct {
	StateRoot, BundleRoot, DiskTemplates, RunDir string
}

// DiskLayout is the layout of nodes before OpenDataDir: state and bundles on the data dir's
// file system, where an older node's guests may still run.
func DiskLayout(dataDir string) Layout {
	return Layout{StateRoot: filepath.Join(dataDir, "oci-state"), BundleRoot: filepath.Join(dataDir, "bundles"),
		DiskTemplates: filepath.Join(dataDir, "bundles", diskTemplates)}
}

// RunLayout keeps state and bundles on a tmpfs at <data dir>/run, as containerd keeps them
// under /run: on this host's ext4 (no journal), each new inode is checked against recent
// deletions, and a guest's start and end made and removed a dozen of them (about 3 ms of
// wb's CPU and 1.5 ms of runc's a guest). The disk templates stay on disk, beside the
// guests' disk images they are copied into (a copy between file systems cannot share
// extents).
func RunLayout(dataDir string) Layout {
	l := DiskLayout(dataDir)
	l.RunDir = filepath.Join(dataDir, "run")
	l.StateRoot, l.BundleRoot = filepath.Join(l.RunDir, "oci-state"), filepath.Join(l.RunDir, "bundles")
	return l
}

// Layouts are the layouts a driver on dataDir may use, the one OpenDataDir prefers first:
// what must be searched for guests a node left.
func Layouts(dataDir string) []Layout { return []Layout{RunLayout(dataDir), DiskLayout(dataDir)} }

// OpenDataDir answers a driver with o's options on the node's data dir dataDir (o's
// StateRoot, BundleRoot and DiskTemplates are set here), and its layout:
//   - guests in the on-disk layout (an older node's, still running through a rolling
//     deploy): that layout, until it holds none. Guests left in the run dir then are
//     destroyed, and the run dir unmounted (reapRunDir);
//   - else the run dir, a tmpfs of runBytes (RunDirBytes) mounted at <data dir>/run unless
//     something is mounted there already: a node restarted while its guests run finds its
//     tmpfs there and adopts them. A host's reboot takes the tmpfs and the guests alike:
//     the node finds them gone, as it would find them stopped on disk.
//
// An on-disk state the runtime cannot list (an entry it cannot read: runsc's list fails on
// one) may hold guests or not: the node keeps it, where they would run, unless the run dir
// lists guests and none of the bundles on disk is a guest the runtime knows (asked one by
// one): the run dir's are then its own. Either way no guest is destroyed on a doubt, and
// the node starts, saying so.
func OpenDataDir(ctx context.Context, o Options, dataDir string, runBytes int64) (*Driver, Layout, error) {
	disk, run := DiskLayout(dataDir), RunLayout(dataDir)
	held, unlisted, err := holdsGuests(ctx, o, disk)
	if err != nil {
		return nil, Layout{}, err
	}
	if unlisted != nil {
		if held, err = diskUnlisted(ctx, o, disk, run, unlisted); err != nil {
			return nil, Layout{}, err
		}
	}
	if held {
		d, err := newOn(o, disk)
		if err != nil {
			return nil, Layout{}, err
		}
		if unlisted != nil {
			d.log.Warn("oci: the runtime cannot list its state on the data dir's disk, where an older node's guests may run: "+
				"this node drives that state, and moves to a tmpfs run dir at a start that can list it and finds no guest there "+
				"(`"+d.name+" --root "+disk.StateRoot+" list` fails on an entry there: remove it)", "state", disk.StateRoot, "err", unlisted)
		}
		if err := reapRunDir(ctx, o, run); err != nil {
			d.log.Warn("oci: guests left in the run dir, which this node does not drive", "dir", run.RunDir, "err", err)
		}
		return d, disk, nil
	}
	if err := os.MkdirAll(run.RunDir, 0o711); err != nil {
		return nil, Layout{}, fmt.Errorf("oci: run dir: %w", err)
	}
	// Not noexec: runc 1.1, when it cannot clone its binary into a memfd, copies it into
	// the container's state dir and executes that copy.
	if !mounted(run.RunDir) {
		opts := "mode=0711,size=" + strconv.FormatInt(runBytes, 10) + ",nr_inodes=" + strconv.FormatInt(max(runBytes/4096, 64), 10)
		if err := syscall.Mount("tmpfs", run.RunDir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
			return nil, Layout{}, fmt.Errorf("oci: mount a tmpfs on %s for the runtime's state and bundles: %w", run.RunDir, err)
		}
	}
	d, err := newOn(o, run)
	if err == nil && unlisted != nil {
		d.log.Warn("oci: the runtime cannot list its state on the data dir's disk: this node drives its guests in the run dir, "+
			"and any an older node left on disk are not driven (`"+d.name+" --root "+disk.StateRoot+" list` fails on an entry there: remove it)",
			"state", disk.StateRoot, "err", unlisted)
	}
	return d, run, err
}

// diskUnlisted answers whether a node whose on-disk state the runtime could not list
// (unlisted) keeps to it: when the runtime knows a guest of a bundle there (asked one by
// one), or unless the run dir is mounted and lists guests, the node's own. Guests in both
// are a rolled back node's, whose on-disk ones run on (see reapRunDir), as when the state
// lists. Neither listed, the node cannot tell where its guests are, and does not start.
func diskUnlisted(ctx context.Context, o Options, disk, run Layout, unlisted error) (bool, error) {
	if !mounted(run.RunDir) || bundledGuests(ctx, o, disk) {
		return true, nil
	}
	held, runUnlisted, err := holdsGuests(ctx, o, run)
	if err == nil && runUnlisted != nil {
		err = runUnlisted
	}
	if err != nil {
		return false, fmt.Errorf("oci: neither the runtime's state on the data dir's disk (%v) nor that in the run dir %s (%w) can be listed: "+
			"the node cannot tell which holds its guests", unlisted, run.RunDir, err)
	}
	return !held, nil
}

// bundledGuests reports whether the runtime knows the guest of any bundle in l: asked one
// by one, where its list of l's state fails on another entry.
func bundledGuests(ctx context.Context, o Options, l Layout) bool {
	es, err := os.ReadDir(l.BundleRoot)
	if err != nil || len(es) == 0 {
		return false
	}
	d, err := newOn(o, l)
	if err != nil {
		return false
	}
	for _, e := range es {
		if !e.IsDir() || !hypervisor.ValidID(e.Name()) {
			continue // the disk templates
		}
		if _, err := d.Info(ctx, e.Name()); err == nil {
			return true
		}
	}
	return false
}

// reapRunDir destroys the guests in run's run dir, if it is mounted, and unmounts it, for a
// driver on the on-disk layout: a node drives one layout, and guests in both are a rolled back
// node's (the older node, which found the run dir's guests gone and failed their sessions,
// started its own on disk). Left, no node would ever see the run dir's again, and they would
// run on for good.
func reapRunDir(ctx context.Context, o Options, run Layout) error {
	if !mounted(run.RunDir) {
		return nil
	}
	r, err := newOn(o, run)
	if err != nil {
		return err
	}
	ids, err := r.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		r.log.Warn("oci: removing a guest of the run dir, which no node drives while guests run on the on-disk layout", "id", id)
		_ = r.Stop(ctx, id)
		if err := r.Delete(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return r.ReleaseRunDir(ctx)
}

// holdsGuests reports whether the runtime lists guests in l's state root; unlisted is the
// runtime's failure to list them. An absent or empty state root holds none, and is not asked
// of the runtime.
func holdsGuests(ctx context.Context, o Options, l Layout) (held bool, unlisted, err error) {
	es, err := os.ReadDir(l.StateRoot)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(es) == 0) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, fmt.Errorf("oci: %w", err)
	}
	d, err := newOn(o, l)
	if err != nil {
		return false, nil, err
	}
	ids, err := d.List(ctx)
	if err != nil {
		return false, err, nil
	}
	return len(ids) > 0, nil, nil
}

func newOn(o Options, l Layout) (*Driver, error) {
	o.StateRoot, o.BundleRoot, o.DiskTemplates = l.StateRoot, l.BundleRoot, l.DiskTemplates
	d, err := New(o)
	if err != nil {
		return nil, err
	}
	d.runDir = l.RunDir
	return d, nil
}

// ReleaseRunDir unmounts the run dir of a driver OpenDataDir put on one, if it holds no
// guest (a node winding down with none left): nothing in it would be adopted. With guests it
// stays, for the node's next start.
func (d *Driver) ReleaseRunDir(ctx context.Context) error {
	if d.runDir == "" || !mounted(d.runDir) {
		return nil
	}
	ids, err := d.List(ctx)
	if err != nil {
		return err
	}
	if len(ids) > 0 {
		return nil
	}
	if err := syscall.Unmount(d.runDir, 0); err != nil {
		return fmt.Errorf("oci: unmount the run dir %s: %w", d.runDir, err)
	}
	return nil
}

// noRoom says of err, guest id's failed start, that the file system of the runtime's state
// and bundles is full, when it is (less than noRoomBytes or noRoomInodes left): the runtime's
// own words on it vary. The guests already there are unaffected.
func (d *Driver) noRoom(id string, err error) error {
	var st unix.Statfs_t
	if err == nil || unix.Statfs(d.rt.Root, &st) != nil {
		return err
	}
	if free := int64(st.Bavail) * st.Bsize; free >= noRoomBytes && st.Ffree >= noRoomInodes && !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	return fmt.Errorf("oci: guest %s: no room left for its runtime state and bundle in %s (%d KiB, %d inodes free): the guests there keep running, "+
		"and room comes back as they end; a node on a tmpfs run dir holds at most %d MiB of them: %w",
		id, filepath.Dir(d.rt.Root), int64(st.Bavail)*st.Bsize>>10, st.Ffree, RunDirBytes>>20, err)
}

// noRoomBytes and noRoomInodes are less room than a guest's start needs (RunDirBytes).
const (
	noRoomBytes  = 256 << 10
	noRoomInodes = 32
)
