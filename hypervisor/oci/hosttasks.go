package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"wb/hypervisor"
)

var _ hypervisor.HostTasker = (*Driver)(nil)

// The host's guests' process total, as the node watches it (hypervisor.HostTasker): the
// pids.current of Options.GuestsCgroup against its pids.max (capGuestsPids). The total is
// read at each of the node's ticks; its limit, which only an operator or another node's
// start changes, now and then (guestsMax).

// guestsMaxEvery is how often GuestsTotal reads the total's limit again while the guests
// hold under three quarters of it (above, at every call).
const guestsMaxEvery = time.Minute

// guestsMax is the total's pids.max as last read, and when (unix ns; 0: never).
type guestsMax struct{ limit, at atomic.Int64 }

// GuestsTotal answers the host tasks the host's guests hold together (one read of the
// common cgroup's pids.current) and their limit (-1: none).
func (d *Driver) GuestsTotal() (cur, limit int64, err error) {
	dir := d.cg.pidsDir(d.guestsCgroup)
	cur, err = readInt(filepath.Join(dir, "pids.current"))
	if err != nil {
		return 0, 0, fmt.Errorf("oci: the guests' process total: %w", err)
	}
	limit = d.guestsMax.limit.Load()
	now := time.Now().UnixNano()
	if at := d.guestsMax.at.Load(); at == 0 || now-at > int64(guestsMaxEvery) || cur*4 >= limit*3 {
		if limit, err = readInt(filepath.Join(dir, "pids.max")); err != nil {
			return 0, 0, fmt.Errorf("oci: the guests' process total: %w", err)
		}
		d.guestsMax.limit.Store(limit)
		d.guestsMax.at.Store(now)
	}
	return cur, limit, nil
}

// guestsCgroupsMax bounds the cgroups GuestsTasks looks at: every guest on a host, of every
// node there, is one, and their host tasks bound how many there can be.
const guestsCgroupsMax = 1 << 14

// GuestsTasks answers every cgroup below Options.GuestsCgroup that holds tasks and has no
// cgroups below it (every node's guests: <GuestsCgroup>/<node>/<guest id>, or one level up
// for a node whose CgroupParent is GuestsCgroup), with its count; those in this driver's
// CgroupParent are its guests. Read only near the total: one directory per node and a file
// per guest.
func (d *Driver) GuestsTasks(ctx context.Context) ([]hypervisor.GuestTasks, error) {
	root := d.cg.pidsDir(d.guestsCgroup)
	own := d.cg.pidsDir(d.cgroupParent)
	var out []hypervisor.GuestTasks
	seen := 0
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && dir != root {
				return nil // a guest that went meanwhile
			}
			return fmt.Errorf("oci: the guests' cgroups: %w", err)
		}
		leaf := true
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			leaf = false
			if seen++; seen > guestsCgroupsMax {
				return fmt.Errorf("oci: more than %d cgroups below %s", guestsCgroupsMax, d.guestsCgroup)
			}
			if depth < 3 {
				if err := walk(filepath.Join(dir, e.Name()), depth+1); err != nil {
					return err
				}
			}
		}
		if !leaf || dir == root {
			return nil
		}
		n, err := readInt(filepath.Join(dir, "pids.current"))
		if err != nil || n <= 0 {
			return nil
		}
		g := hypervisor.GuestTasks{Own: filepath.Dir(dir) == own, Tasks: n}
		if g.ID = filepath.Base(dir); !g.Own {
			g.ID, _ = filepath.Rel(root, dir)
		}
		out = append(out, g)
		return nil
	}
	if err := walk(root, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// GuestTasks answers the host tasks guest id holds.
func (d *Driver) GuestTasks(ctx context.Context, id string) (int64, error) {
	g, err := d.loadGuest(id)
	if err != nil {
		return 0, err
	}
	cur, _ := d.cg.pidsFiles(g.CgroupsPath)
	if cur == "" {
		return 0, errors.New("oci: no pids controller")
	}
	return readInt(cur)
}
