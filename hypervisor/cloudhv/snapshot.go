package cloudhv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv/chapi"
	"wb/hypervisor/cloudhv/image"
	"wb/hypervisor/internal/guestfile"
)

// Snapshot directory layout.
const (
	snapshotMeta   = "snapshot.json"
	snapshotDisk   = "writable.img" // the writable disk, copied sparsely while the VM was paused
	snapshotVM     = "vm"           // CH's snapshot (config.json, state.json, memory-ranges)
	snapshotFormat = 1
)

// snapshotRecord is snapshot.json.
type snapshotRecord struct {
	Format    int       `json:"format"`
	Driver    string    `json:"driver"`
	GuestID   string    `json:"guest_id"`
	Memory    bool      `json:"memory"`
	CreatedAt time.Time `json:"created_at"`
	// RootFS (its file name in the cache dir) and RootFSUUID (its filesystem's) name the root
	// disk image a memory snapshot's guest ran on: its restore needs that very image.
	RootFS     string `json:"rootfs_image,omitempty"`
	RootFSUUID string `json:"rootfs_uuid,omitempty"`
}

// ErrSnapshotImage is a memory snapshot's restore refused because this node does not have
// the root disk image its guest ran on: another node's build of it, or another wb's (an
// upgrade). The guest's memory holds that image's page cache and its kernel's view of that
// filesystem, so it cannot run on another; the snapshot's disk can still be restored alone.
var ErrSnapshotImage = errors.New("the memory snapshot's root disk image is not on this node")

// Snapshot pauses the VM (a running one), with memory has CH write its snapshot to dir/vm,
// copies the writable disk into dir while the VM is paused, and then resumes it — or, after
// a memory snapshot, stops it (the caller restores it, as the interface says). A guest that
// is only created has nothing in memory: its disk is copied as it is. A snapshot that fails
// leaves the guest as it found it, running on, and dir without the snapshot's files.
func (d *Driver) Snapshot(ctx context.Context, id, dir string, memory bool) (out hypervisor.SnapshotInfo, err error) {
	info, err := d.Info(ctx, id)
	if err != nil {
		return out, err
	}
	_, serr := os.Stat(dir)
	fresh := errors.Is(serr, fs.ErrNotExist)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return out, fmt.Errorf("cloudhv: snapshot dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshotMeta)); err == nil {
		return out, fmt.Errorf("cloudhv: snapshot dir %s already holds a snapshot", dir)
	}
	booted := info.State == hypervisor.StateRunning || info.State == hypervisor.StatePaused
	memory = memory && booted
	c := d.client(id)
	paused, whole := false, false
	var made []string // what this snapshot wrote into dir, removed should it fail
	defer func() {
		if err != nil && !whole {
			if fresh {
				made = []string{dir}
			}
			for _, p := range made {
				if rerr := os.RemoveAll(p); rerr != nil {
					d.log.Warn("remove a failed snapshot's files", "id", id, "err", rerr)
				}
			}
		}
		// A disk snapshot's guest runs on, and so does one whose memory snapshot failed: the
		// caller finds it as it was (a VM left paused would hold its session frozen).
		if paused && (!memory || !whole) {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if rerr := c.ResumeVM(rctx); rerr != nil {
				d.log.Error("resume after a snapshot", "id", id, "memory", memory, "err", rerr)
			}
		}
	}()
	if memory {
		// No connection through the egress relay outlives a memory snapshot: the restored
		// guest has another VMM, network and relay. As runsc's agent closes the ones it relays
		// before a checkpoint, they end now, while the guest still runs (the sync below gives
		// it time to see them end) rather than hang in the restored guest; and the Stop that
		// ends the snapshot has none to wait for. A snapshot that fails serves the relay again.
		d.stopRelay(ctx, id)
		defer func() {
			if whole {
				return
			}
			if r, lerr := d.load(id); lerr == nil && r.alive() {
				if rerr := d.startRelay(r); rerr != nil {
					d.log.Error("egress relay after a failed snapshot", "id", id, "err", rerr)
				}
			}
		}()
	}
	if info.State == hypervisor.StateRunning {
		d.syncGuest(ctx, id)
		if err := c.PauseVM(ctx); err != nil {
			return out, fmt.Errorf("cloudhv: snapshot %s: %w", id, err)
		}
		paused = true
	}
	if memory {
		vm := filepath.Join(dir, snapshotVM)
		if err := os.Mkdir(vm, 0o700); err != nil {
			return out, fmt.Errorf("cloudhv: snapshot dir: %w", err)
		}
		made = append(made, vm)
		if err := c.SnapshotVM(ctx, chapi.VmSnapshotConfig{DestinationURL: "file://" + vm}); err != nil {
			return out, fmt.Errorf("cloudhv: snapshot %s: %w", id, err)
		}
	}
	// copySparse removes its file should it fail, and never replaces one that was there.
	if err := copySparse(filepath.Join(d.GuestDir(id), writableDisk), filepath.Join(dir, snapshotDisk)); err != nil {
		return out, fmt.Errorf("cloudhv: snapshot %s: writable disk: %w", id, err)
	}
	made = append(made, filepath.Join(dir, snapshotDisk))
	rec := snapshotRecord{Format: snapshotFormat, Driver: Name, GuestID: id, Memory: memory, CreatedAt: time.Now().UTC()}
	if memory {
		r, err := d.load(id)
		if err != nil {
			return out, err
		}
		rec.RootFS = filepath.Base(r.RootFS)
		if rec.RootFSUUID, err = image.FilesystemUUID(r.RootFS); err != nil {
			return out, fmt.Errorf("cloudhv: snapshot %s: root disk: %w", id, err)
		}
	}
	if err := writeJSON(filepath.Join(dir, snapshotMeta), rec); err != nil {
		return out, err
	}
	whole = true
	if memory {
		if err := d.Stop(ctx, id); err != nil {
			return out, fmt.Errorf("cloudhv: snapshot %s: stop after the memory snapshot: %w", id, err)
		}
	}
	out.Memory = memory
	if memory {
		out.RootImage = rootImageID(rec.RootFS, rec.RootFSUUID)
	}
	out.SizeBytes = guestfile.DiskUsage(dir)
	return out, nil
}

// rootImageID is how SnapshotInfo.RootImage and RootImages name a root disk image: by the two
// things a memory restore checks of it (snapshotRootFS), its file name in the cache dir and
// its filesystem's UUID.
func rootImageID(name, uuid string) string { return name + "/" + uuid }

// RootImages names the root disk images in this node's cache dir (hypervisor.RootImager): the
// memory snapshots it can restore are those whose RootImage is one of them. It reads each
// image's superblock, a few small reads per heartbeat; an image being built is not named (it
// is renamed into place whole). A listing that fails (an I/O error, a permission) answers the
// last good one's images, warning once a run of failures: the node advertises the answer on
// each heartbeat, and none would have the gateway refuse every restore of a memory snapshot
// taken here (and wake desktops from their disks) until a listing succeeded. The driver
// removes no image from the cache, so the last good listing's are still there, or gone with
// the whole cache (a restore placed here then is refused by ErrSnapshotImage, and the node
// starts the session from the disk).
func (d *Driver) RootImages() []string {
	d.imagesMu.Lock()
	defer d.imagesMu.Unlock()
	out, err := d.listRootImages()
	if err != nil {
		if !d.imagesFailing {
			d.log.Warn("list the root disk images: advertising those of the last good listing until one succeeds",
				"err", err, "images", len(d.images))
			d.imagesFailing = true
		}
		return slices.Clone(d.images)
	}
	if d.imagesFailing {
		d.log.Info("the root disk images are listed again", "images", len(out))
		d.imagesFailing = false
	}
	d.images = out
	return slices.Clone(out)
}

// listRootImages is RootImages' listing of the cache dir, none when there is no cache dir.
func (d *Driver) listRootImages() ([]string, error) {
	ents, err := os.ReadDir(d.o.CacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), "rootfs-") {
			continue
		}
		uuid, err := image.FilesystemUUID(filepath.Join(d.o.CacheDir, e.Name()))
		if err != nil {
			continue // not an image a restore could use either
		}
		out = append(out, rootImageID(e.Name(), uuid))
	}
	return out, nil
}

// syncTimeout bounds the guest's sync before a disk snapshot.
const syncTimeout = 30 * time.Second

// syncGuest has the guest's kernel write its dirty pages to the disks (sync(1) through the
// agent): a disk snapshot copies the disk image, which holds only what the guest wrote back.
// A memory snapshot holds the page cache itself, but syncing costs little and keeps a VMM
// whose memory snapshot does not (the test VMM's) right too. A guest that cannot sync is
// snapshotted all the same, with a warning: its latest writes may be missing.
func (d *Driver) syncGuest(ctx context.Context, id string) {
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	c := agent.NewDialClient(func(ctx context.Context) (net.Conn, error) { return d.DialAgent(ctx, id) })
	defer c.Close()
	res, err := c.Exec(sctx, agent.ExecRequest{Argv: []string{"sync"}}, nil)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("sync exited %d: %s", res.ExitCode, res.Stderr)
	}
	if err != nil {
		d.log.Warn("the guest did not sync before a disk snapshot; its latest writes may be missing", "id", id, "err", err)
	}
}

// Restore makes guest s from snapshot dir and runs it: a memory snapshot is restored by a
// new VMM (vm.restore with resume) from a copy of CH's snapshot whose config names the new
// guest's files; a disk-only one boots afresh on a copy of the disk. A memory snapshot whose
// root disk image this node does not have is refused (ErrSnapshotImage).
func (d *Driver) Restore(ctx context.Context, s hypervisor.Spec, dir string) error {
	if err := s.Validate(); err != nil {
		return err
	}
	var rec snapshotRecord
	if err := guestfile.ReadJSON(filepath.Join(dir, snapshotMeta), &rec); err != nil {
		return fmt.Errorf("cloudhv: snapshot %s: %w", dir, err)
	}
	if rec.Format != snapshotFormat || rec.Driver != Name {
		return fmt.Errorf("cloudhv: snapshot %s is %s format %d, not a cloudhv snapshot of format %d", dir, rec.Driver, rec.Format, snapshotFormat)
	}
	disk := filepath.Join(dir, snapshotDisk)
	if !rec.Memory {
		if err := d.create(ctx, s, disk, nil); err != nil {
			return err
		}
		if err := d.Boot(ctx, s.ID); err != nil {
			d.cleanupFailed(s.ID)
			return err
		}
		return nil
	}
	from := &memoryRestore{vm: filepath.Join(dir, snapshotVM)}
	b, err := os.ReadFile(filepath.Join(from.vm, "config.json"))
	if err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	if err := json.Unmarshal(b, &from.cfg); err != nil {
		return fmt.Errorf("cloudhv: restore: config.json: %w", err)
	}
	if from.rootfs, err = d.snapshotRootFS(rec, from.cfg); err != nil {
		return err
	}
	return d.create(ctx, s, disk, from)
}

// memoryRestore is a memory snapshot to restore: CH's snapshot dir, its config.json, and the
// root disk image of this node's to restore it on (snapshotRootFS).
type memoryRestore struct {
	vm, rootfs string
	cfg        map[string]any
}

// snapshotRootFS is the image in this node's cache dir that a memory snapshot's guest ran on:
// of the same name (the digest of template and wb binary) and the same filesystem (a build of
// the image of its own, on another node or after the cache was rebuilt, differs in layout as
// in UUID). Another image would have the restored kernel read blocks its memory does not
// describe, and a different wb has another agent: such a snapshot is refused
// (ErrSnapshotImage), and can be restored from its disk alone. This node's kernel is no
// matter: the guest's runs from its memory. (The UUID stands for the image's content because
// mkfs.ext4 draws it at random; a build that fixed it would have to be reproducible byte for
// byte, or this check compare the images' content instead.)
func (d *Driver) snapshotRootFS(rec snapshotRecord, cfg map[string]any) (string, error) {
	name, uuid := rec.RootFS, rec.RootFSUUID
	if name == "" || uuid == "" {
		// A snapshot of an earlier driver: its config.json names the image by a path on the
		// node that took it, and the file at that path here (another node's build, with the
		// same --data-dir) cannot be told from the image the guest ran on.
		return "", fmt.Errorf("cloudhv: restore: %w: the snapshot names no root disk image it can be checked against (an earlier wb took it): restore the snapshot without its memory", ErrSnapshotImage)
	}
	if name != filepath.Base(name) || !strings.HasPrefix(name, "rootfs-") {
		return "", fmt.Errorf("cloudhv: restore: the snapshot's root disk image %q is not one of a cache dir", name)
	}
	img := filepath.Join(d.o.CacheDir, name)
	got, err := image.FilesystemUUID(img)
	if err != nil || uuid == "" || got != uuid {
		return "", fmt.Errorf("cloudhv: restore: %w: its guest ran on %s (filesystem %s); this node has %s: restore the snapshot without its memory", ErrSnapshotImage, name, uuid, haveImage(got, err))
	}
	return img, nil
}

// haveImage says what the node has of an image, for an error: its filesystem's UUID, or none.
func haveImage(uuid string, err error) string {
	if err != nil {
		return "none of that name"
	}
	return "another build of it (filesystem " + uuid + ")"
}

// configDisk is the disk of id id in a CH config (nil when there is none).
func configDisk(cfg map[string]any, id string) map[string]any {
	disks, _ := cfg["disks"].([]any)
	for _, x := range disks {
		if m, ok := x.(map[string]any); ok && m["id"] == id {
			return m
		}
	}
	return nil
}

// stageRestore copies CH's snapshot from.vm into dst (hard links where it can: memory-ranges
// is as large as the guest's memory), with config.json naming guest s's files: its writable
// disk and vsock socket, this node's root disk image (from.rootfs) and its kernel and
// initramfs, which a reboot of the restored guest loads.
func (d *Driver) stageRestore(from *memoryRestore, dst string, s hypervisor.Spec) error {
	ents, err := os.ReadDir(from.vm)
	if err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == "config.json" {
			continue
		}
		src, to := filepath.Join(from.vm, e.Name()), filepath.Join(dst, e.Name())
		if err := os.Link(src, to); err != nil {
			if err := copySparse(src, to); err != nil {
				return fmt.Errorf("cloudhv: restore: %w", err)
			}
		}
	}
	cfg := from.cfg
	gdir := d.GuestDir(s.ID)
	for id, path := range map[string]string{"writable": filepath.Join(gdir, writableDisk), "rootfs": from.rootfs} {
		m := configDisk(cfg, id)
		if m == nil {
			return fmt.Errorf("cloudhv: restore: the snapshot's config.json has no disk %q", id)
		}
		m["path"] = path
	}
	vs, ok := cfg["vsock"].(map[string]any)
	if !ok {
		return errors.New("cloudhv: restore: the snapshot's config.json has no vsock device")
	}
	vs["socket"] = filepath.Join(gdir, vsockSocket)
	payload, ok := cfg["payload"].(map[string]any)
	if !ok {
		return errors.New("cloudhv: restore: the snapshot's config.json has no payload")
	}
	payload["kernel"] = d.o.Kernel
	if d.o.Initramfs != "" {
		payload["initramfs"] = d.o.Initramfs
	} else {
		delete(payload, "initramfs")
	}
	// The restored VM's console is a new terminal, whatever the snapshot's was (an earlier
	// driver's File grew without bound).
	con, _ := cfg["console"].(map[string]any)
	if con == nil {
		con = map[string]any{}
		cfg["console"] = con
	}
	con["mode"] = consoleMode
	delete(con, "file")
	nb, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), nb, 0o600); err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	return nil
}

// copySparse copies file src to the new file dst, writing only src's data extents (found
// with SEEK_DATA/SEEK_HOLE), so a sparse disk image stays sparse.
func copySparse(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	fd := int(in.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data in %s: %w", src, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole in %s: %w", src, err)
		}
		if _, err := io.CopyBuffer(io.NewOffsetWriter(out, data), io.NewSectionReader(in, data, hole-data), buf); err != nil {
			return err
		}
		off = hole
	}
	return out.Sync()
}
