package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"wb/hypervisor"
	"wb/session"
)

// Snapshot saves the guest into the node's snapshot directory (see takeSnapshot) and, with
// an object store configured, uploads it before answering (see saved). The guest goes on
// either way.
func (n *Node) Snapshot(ctx context.Context, s *session.Session, snapshotID string, memory bool) (hypervisor.SnapshotInfo, error) {
	return n.saved(ctx, snapshotID, func() (hypervisor.SnapshotInfo, error) { return n.takeSnapshot(ctx, s, snapshotID, memory) })
}

// saved runs take, which writes snapshot snapshotID into the node's snapshot directory (or
// nothing), and, with an object store configured, uploads what it wrote before answering:
// the control plane records the snapshot ready only on this answer, so a node that dies
// before the upload has finished leaves it failed, and a failed upload fails the snapshot.
func (n *Node) saved(ctx context.Context, snapshotID string, take func() (hypervisor.SnapshotInfo, error)) (hypervisor.SnapshotInfo, error) {
	if n.Snapshots == nil {
		return take()
	}
	dir, err := n.snapshotDir(snapshotID)
	if err != nil {
		return hypervisor.SnapshotInfo{}, err
	}
	release := n.snapshotsInUse.acquire(snapshotID)
	defer release()
	info, err := take()
	if err != nil {
		return info, err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return info, nil // nothing written: nothing to upload
	}
	t0 := time.Now()
	m, err := n.Snapshots.Put(ctx, snapshotID, dir)
	if err != nil {
		// What was uploaded has no manifest and is never restored; it goes now if it can.
		if derr := n.Snapshots.Delete(context.WithoutCancel(ctx), snapshotID); derr != nil {
			n.Logger.Warn("node: remove a failed upload", "snapshot", snapshotID, "err", derr)
		}
		return info, fmt.Errorf("snapshot %s: upload to %s: %w", snapshotID, n.Snapshots.Name, err)
	}
	n.Logger.Debug("node: snapshot uploaded", "snapshot", snapshotID, "bytes", m.Bytes(), "took", time.Since(t0))
	n.evictSnapshots(snapshotID)
	return info, nil
}

// restoreDir answers the directory to restore snapshot id from, fetching it from the object
// store when this node lacks it, and a release to call once the restore is done.
func (n *Node) restoreDir(ctx context.Context, id string) (string, func(), error) {
	dir, err := n.snapshotDir(id)
	if err != nil {
		return "", nil, err
	}
	if n.Snapshots == nil {
		return dir, func() {}, nil
	}
	release := n.snapshotsInUse.acquire(id)
	if _, err := os.Stat(dir); err == nil {
		now := time.Now()
		_ = os.Chtimes(dir, now, now) // recently used: evicted last
		return dir, release, nil
	}
	t0 := time.Now()
	m, err := n.Snapshots.Get(ctx, id, dir)
	if err != nil {
		release()
		return "", nil, fmt.Errorf("fetch from %s: %w", n.Snapshots.Name, err)
	}
	n.Logger.Info("node: snapshot fetched", "snapshot", id, "bytes", m.Bytes(), "took", time.Since(t0))
	n.evictSnapshots(id)
	return dir, release, nil
}

// DeleteSnapshot removes a snapshot's files: here, and in the object store. Its directory
// here goes once no take or restore uses it any more (a memory snapshot is answered before
// the guest it stopped has been restored from it).
func (n *Node) DeleteSnapshot(ctx context.Context, id string) error {
	dir, err := n.snapshotDir(id)
	if err != nil {
		return err
	}
	deferred := n.snapshotsInUse.deferWhileBusy(id, func() {
		if err := removeAll(dir); err != nil {
			n.Logger.Warn("node: remove a deleted snapshot after its last use", "snapshot", id, "err", err)
		}
	})
	if !deferred {
		err = removeAll(dir)
	}
	if n.Snapshots != nil {
		err = errors.Join(err, n.Snapshots.Delete(ctx, id))
	}
	return err
}

// evictSnapshots removes the least recently used snapshot directories, except keep and those
// in use, until the snapshot directory holds at most SnapshotCacheBytes. Only with an object
// store: without one these directories are the snapshots themselves.
func (n *Node) evictSnapshots(keep string) {
	root := filepath.Join(n.DataDir, "snapshots")
	entries, err := os.ReadDir(root)
	if err != nil {
		n.Logger.Warn("node: snapshot cache", "err", err)
		return
	}
	type cached struct {
		id    string
		used  time.Time
		bytes int64
	}
	var all []cached
	var total int64
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if strings.HasPrefix(e.Name(), ".") {
			// A download a crash interrupted (snapstore.Get's temporary directory).
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleFetch {
				_ = removeAll(filepath.Join(root, e.Name()))
			}
			continue
		}
		c := cached{id: e.Name()}
		if fi, err := e.Info(); err == nil {
			c.used = fi.ModTime()
		}
		c.bytes = dirBytes(filepath.Join(root, c.id))
		total += c.bytes
		all = append(all, c)
	}
	slices.SortFunc(all, func(a, b cached) int { return a.used.Compare(b.used) })
	for _, c := range all {
		if total <= n.SnapshotCacheBytes {
			return
		}
		if c.id == keep || n.snapshotsInUse.busy(c.id) {
			continue
		}
		if err := removeAll(filepath.Join(root, c.id)); err != nil {
			n.Logger.Warn("node: evict a cached snapshot", "snapshot", c.id, "err", err)
			continue
		}
		total -= c.bytes
		n.Logger.Debug("node: evicted a cached snapshot", "snapshot", c.id, "bytes", c.bytes)
	}
}

// staleFetch is how old a temporary download directory must be to be taken for one a crash
// left: no download of a snapshot takes that long.
const staleFetch = 6 * time.Hour

func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// inUse counts users by key, and holds what is to run once a key's last user lets go.
type inUse struct {
	mu    sync.Mutex
	n     map[string]int
	after map[string]func()
}

func (u *inUse) acquire(key string) (release func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == nil {
		u.n = map[string]int{}
	}
	u.n[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			var then func()
			if u.n[key]--; u.n[key] <= 0 {
				delete(u.n, key)
				then = u.after[key]
				delete(u.after, key)
			}
			u.mu.Unlock()
			if then != nil {
				then()
			}
		})
	}
}

// deferWhileBusy answers true when key is in use, and then f runs as its last user lets go;
// false when it is not, and f is not run.
func (u *inUse) deferWhileBusy(key string, f func()) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n[key] <= 0 {
		return false
	}
	if u.after == nil {
		u.after = map[string]func(){}
	}
	u.after[key] = f
	return true
}

func (u *inUse) busy(key string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[key] > 0
}
