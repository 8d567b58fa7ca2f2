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
	"time"

	"golang.org/x/sys/unix"

	"wb/agent"
	"wb/hypervisor"
	"wb/hypervisor/cloudhv/chapi"
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
}

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
	out.SizeBytes = guestfile.DiskUsage(dir)
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
// guest's disk and vsock socket; a disk-only one boots afresh on a copy of the disk.
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
		if err := d.create(ctx, s, disk, ""); err != nil {
			return err
		}
		if err := d.Boot(ctx, s.ID); err != nil {
			d.cleanupFailed(s.ID)
			return err
		}
		return nil
	}
	// CH restores the VM exactly as config.json describes it, paths included (RestoreConfig
	// can only swap net fds): the copy given to the new VMM names the new guest's files.
	staged, err := os.MkdirTemp(d.o.StateDir, ".restore-")
	if err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	defer os.RemoveAll(staged)
	if err := d.stageRestore(filepath.Join(dir, snapshotVM), staged, s); err != nil {
		return err
	}
	return d.create(ctx, s, disk, staged)
}

// stageRestore copies CH's snapshot src into dst (hard links where it can: memory-ranges is
// as large as the guest's memory), with config.json's writable disk and vsock socket moved to
// guest s's.
func (d *Driver) stageRestore(src, dst string, s hypervisor.Spec) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == "config.json" {
			continue
		}
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if err := os.Link(from, to); err != nil {
			if err := copySparse(from, to); err != nil {
				return fmt.Errorf("cloudhv: restore: %w", err)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		return fmt.Errorf("cloudhv: restore: %w", err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("cloudhv: restore: config.json: %w", err)
	}
	gdir := d.GuestDir(s.ID)
	disks, _ := cfg["disks"].([]any)
	found := false
	for _, x := range disks {
		if m, ok := x.(map[string]any); ok && m["id"] == "writable" {
			m["path"], found = filepath.Join(gdir, writableDisk), true
		}
	}
	if !found {
		return errors.New(`cloudhv: restore: the snapshot's config.json has no disk "writable"`)
	}
	vs, ok := cfg["vsock"].(map[string]any)
	if !ok {
		return errors.New("cloudhv: restore: the snapshot's config.json has no vsock device")
	}
	vs["socket"] = filepath.Join(gdir, vsockSocket)
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
