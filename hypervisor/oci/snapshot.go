package oci

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	gorunc "github.com/containerd/go-runc"

	"wb/hypervisor"
	"wb/hypervisor/internal/guestfile"
)

// Snapshot directory layout.
const (
	snapshotMeta   = "snapshot.json"
	snapshotLayer  = "writable.tar"
	snapshotMemory = "memory" // runsc checkpoint image dir
	// snapshotAgentDir is a memory snapshot's tar of the guest's agent dir (see
	// snapshotRecord.AgentDir), at most agentDirMaxBytes (the agent dir's tmpfs holds 1 MiB).
	snapshotAgentDir = "agentdir.tar"
	agentDirMaxBytes = 1 << 20
	snapshotFormat   = 1
)

// snapshotRecord is snapshot.json.
type snapshotRecord struct {
	Format    int       `json:"format"`
	Runtime   string    `json:"runtime"`
	GuestID   string    `json:"guest_id"`
	Memory    bool      `json:"memory"`
	CreatedAt time.Time `json:"created_at"`
	RootFS    string    `json:"rootfs"`
	BindTgts  []string  `json:"bind_targets,omitempty"`
	AgentBin  bool      `json:"agent_bin"`
	Layer     string    `json:"layer"`
	// AgentDir names the tar of the guest's agent dir beside a memory image: the restore
	// unpacks it into the new guest's agent dir before runsc restores into it, since runsc
	// walks to every file there that a guest process held (its cwd, an open file) and fails
	// the restore on one that is missing ("restoring container …: no such file or
	// directory"): a guest process's cwd in /run/wb lost its session at a live snapshot.
	// Empty in older snapshots (restored into an empty agent dir, as before).
	AgentDir string `json:"agent_dir,omitempty"`
}

// Snapshot saves the writable layer (a tar of Spec.Writable) into dir, and with memory on
// runsc first checkpoints the guest (which stops it). A disk-only snapshot of a running guest
// pauses it while the layer is written so the tar is consistent, then resumes it.
func (d *Driver) Snapshot(ctx context.Context, id, dir string, memory bool) (hypervisor.SnapshotInfo, error) {
	var out hypervisor.SnapshotInfo
	g, err := d.loadGuest(id)
	if err != nil {
		return out, err
	}
	// Known without asking the runtime (a runsc process: 0.1 s here) for a guest this driver
	// started.
	state, ok := d.knownState(id)
	if !ok {
		info, err := d.Info(ctx, id)
		if err != nil {
			return out, err
		}
		state = info.State
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return out, fmt.Errorf("oci: snapshot dir: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshotMeta)); err == nil {
		return out, fmt.Errorf("oci: snapshot dir %s already holds a snapshot", dir)
	}
	useMemory := memory && d.name == RuntimeRunsc &&
		(state == hypervisor.StateRunning || state == hypervisor.StatePaused)
	maxLayer := int64(g.Spec.DiskGiB) << 30
	t0 := time.Now()
	var ckpt time.Duration
	switch {
	case useMemory:
		// The checkpoint stops the guest: a layer that writeLayer would refuse is refused
		// before it, so that the refusal does not cost the guest.
		if err := checkLayerSize(g.Spec.Writable, maxLayer); err != nil {
			return out, err
		}
		if g.Spec.AgentDir != "" {
			if err := checkLayerSize(g.Spec.AgentDir, agentDirMaxBytes); err != nil {
				return out, fmt.Errorf("the agent dir: %w", err)
			}
		}
		t1 := time.Now()
		img := filepath.Join(dir, snapshotMemory)
		if err := os.MkdirAll(img, 0o700); err != nil {
			return out, fmt.Errorf("oci: snapshot dir: %w", err)
		}
		if state == hypervisor.StatePaused {
			// runsc checkpoints a paused sandbox but then keeps reporting it paused, and
			// a later delete panics; checkpoint from running (it stops the guest itself).
			if err := d.rt.Resume(ctx, id); err != nil {
				return out, d.wrap("resume before checkpoint", id, err)
			}
			d.setKnownState(id, hypervisor.StateRunning)
		}
		if err := d.checkpoint(ctx, id, img); err != nil {
			return out, err
		}
		d.setKnownState(id, hypervisor.StateStopped) // until its sandbox is gone
		ckpt = time.Since(t1)
	case state == hypervisor.StateRunning:
		if err := d.freeze(ctx, id); err != nil {
			return out, err
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if rerr := d.thaw(rctx, id); rerr != nil {
				d.log.Error("resume after disk snapshot", "id", id, "err", rerr)
			}
		}()
	}
	if memory && !useMemory {
		d.log.Debug("memory snapshot not available; disk only", "id", id, "state", state)
	}
	t2 := time.Now()
	if err := writeLayer(ctx, g.Spec.Writable, filepath.Join(dir, snapshotLayer), maxLayer); err != nil {
		return out, err
	}
	layer := time.Since(t2)
	var agentDir string
	if useMemory && g.Spec.AgentDir != "" {
		if err := writeLayer(ctx, g.Spec.AgentDir, filepath.Join(dir, snapshotAgentDir), agentDirMaxBytes); err != nil {
			return out, fmt.Errorf("the agent dir: %w", err)
		}
		agentDir = snapshotAgentDir
	}
	rec := snapshotRecord{
		Format: snapshotFormat, Runtime: d.name, GuestID: id, Memory: useMemory, CreatedAt: time.Now().UTC(),
		RootFS: g.Spec.RootFS, AgentBin: g.Spec.AgentBin != "", Layer: snapshotLayer, AgentDir: agentDir,
	}
	for _, b := range g.Spec.ReadOnlyBinds {
		rec.BindTgts = append(rec.BindTgts, b.Target)
	}
	if err := writeJSON(filepath.Join(dir, snapshotMeta), rec); err != nil {
		return out, err
	}
	out.Memory = useMemory
	out.SizeBytes = guestfile.DiskUsage(dir)
	if useMemory {
		d.log.Debug("guest checkpointed", "id", id, "took", time.Since(t0), "checkpoint", ckpt, "layer", layer)
	}
	return out, nil
}

// Restore makes a new guest s from snapshot dir: the writable layer is unpacked into
// s.Writable (which must be empty), then the guest's memory is restored (runsc restore
// --detach) when the snapshot has it, else the guest boots afresh.
func (d *Driver) Restore(ctx context.Context, s hypervisor.Spec, dir string) error {
	return d.restore(ctx, s, dir, "")
}

// RestoreAdopting is Restore of a memory snapshot just taken of guest from (which its
// checkpoint stopped): the new guest takes over from's writable layer, disk and all, instead
// of a new disk with the snapshot's copy unpacked into it. from is left with no layer; it is
// still to be deleted. A snapshot without memory, or from with another disk size, is
// restored as Restore does.
func (d *Driver) RestoreAdopting(ctx context.Context, s hypervisor.Spec, dir, from string) error {
	return d.restore(ctx, s, dir, from)
}

func (d *Driver) restore(ctx context.Context, s hypervisor.Spec, dir, from string) error {
	if err := s.Validate(); err != nil {
		return err
	}
	var rec snapshotRecord
	if err := guestfile.ReadJSON(filepath.Join(dir, snapshotMeta), &rec); err != nil {
		return fmt.Errorf("oci: snapshot %s: %w", dir, err)
	}
	if rec.Format != snapshotFormat {
		return fmt.Errorf("oci: snapshot %s: unknown format %d", dir, rec.Format)
	}
	// The record is a file on disk: its layer must name a file inside dir, nothing more.
	if !plainFileName(rec.Layer) {
		return fmt.Errorf("oci: snapshot %s: layer %q is not a plain file name", dir, rec.Layer)
	}
	if rec.AgentDir != "" && !plainFileName(rec.AgentDir) {
		return fmt.Errorf("oci: snapshot %s: agent dir %q is not a plain file name", dir, rec.AgentDir)
	}
	if rec.Memory {
		if rec.Runtime != d.name {
			return fmt.Errorf("oci: snapshot %s holds %s memory; this driver is %s", dir, rec.Runtime, d.name)
		}
		var tg []string
		for _, b := range s.ReadOnlyBinds {
			tg = append(tg, b.Target)
		}
		if filepath.Clean(rec.RootFS) != filepath.Clean(s.RootFS) || !slices.Equal(tg, rec.BindTgts) || rec.AgentBin != (s.AgentBin != "") {
			return fmt.Errorf("oci: snapshot %s: a memory restore needs the same rootfs and mounts as the snapshotted guest", dir)
		}
	}
	if _, err := d.loadGuest(s.ID); err == nil {
		return fmt.Errorf("oci: guest %s already exists", s.ID)
	}
	t0 := time.Now()
	adopted, err := d.adoptLayer(rec, s, from)
	if err != nil {
		return err
	}
	if !adopted {
		if err := d.attachDisk(ctx, s); err != nil {
			return err
		}
		// The layer is unpacked into an empty dir: without the dirs a new disk has (see
		// layoutTemplate), which the snapshot's layer brings as they were.
		for _, w := range hypervisor.WritableMounts() {
			if err := os.Remove(filepath.Join(s.Writable, w.Subdir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				_ = detachDisk(s)
				return fmt.Errorf("oci: restore %s: empty the new layer: %w", s.ID, err)
			}
		}
	}
	disk := time.Since(t0)
	// No guest record holds s's disk (a new one, or from's adopted) until prepare writes one,
	// so no Delete would let it go: its loop mount stayed, and the node's removal of the
	// guest's dir met "device or resource busy".
	letGo := func(err error) error {
		if derr := detachDisk(s); derr != nil {
			d.log.Warn("restore: let go of the new guest's disk", "id", s.ID, "adopted", adopted, "err", derr)
		}
		return err
	}
	if !adopted {
		if err := readLayer(ctx, filepath.Join(dir, rec.Layer), s.Writable); err != nil {
			return letGo(err)
		}
	}
	layer := time.Since(t0) - disk
	if !rec.Memory {
		return d.Launch(ctx, s)
	}
	t0 = time.Now()
	bundle, err := d.prepare(s)
	if err != nil {
		return letGo(d.noRoom(s.ID, err))
	}
	if rec.AgentDir != "" { // into the agent dir's new tmpfs, which prepare mounted
		if err := readLayer(ctx, filepath.Join(dir, rec.AgentDir), s.AgentDir); err != nil {
			d.cleanupFailed(s.ID)
			return fmt.Errorf("oci: restore %s: the agent dir: %w", s.ID, err)
		}
	}
	con, off, err := d.openConsole(bundle)
	if err != nil {
		d.cleanupFailed(s.ID)
		return fmt.Errorf("oci: restore %s: %w", s.ID, err)
	}
	defer con.Close()
	pf := filepath.Join(bundle, pidFile)
	err = startsGuest(ctx, d.log, slowStartWarn, d.name+" restore", s.ID, func(ctx context.Context) error {
		_, err := d.rt.Restore(ctx, s.ID, bundle, &gorunc.RestoreOpts{
			CheckpointOpts: gorunc.CheckpointOpts{ImagePath: filepath.Join(dir, snapshotMemory)},
			IO:             con,
			Detach:         true,
			PidFile:        pf,
		})
		return err
	})
	if err != nil {
		err = d.noRoom(s.ID, con.withTail(off, fmt.Errorf("oci: %s restore %s: %w", d.name, s.ID, err)))
		d.cleanupFailed(s.ID)
		return err
	}
	d.rememberInit(s.ID, pf, hypervisor.StateRunning)
	d.log.Debug("guest restored", "id", s.ID, "took", time.Since(t0), "disk", disk, "layer", layer, "adopted", adopted)
	return nil
}

// adoptLayer moves guest from's writable layer to s, for a restore of the memory snapshot rec
// just taken of from: a mounted disk is bound at s.Writable (its mount flags go with it) and
// its image renamed to s's, and the old mount point let go; a plain directory is renamed.
// false (and nothing done) when there is nothing to adopt: no from, a snapshot without
// memory or not of from, or a layer that differs in its disk size.
func (d *Driver) adoptLayer(rec snapshotRecord, s hypervisor.Spec, from string) (bool, error) {
	if from == "" || !rec.Memory || rec.GuestID != from {
		return false, nil
	}
	g, err := d.loadGuest(from)
	if err != nil {
		return false, err
	}
	old := g.Spec
	if old.DiskGiB != s.DiskGiB || old.Writable == "" {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(s.Writable)), 0o755); err != nil {
		return false, fmt.Errorf("oci: writable layer: %w", err)
	}
	if !mounted(old.Writable) {
		if err := os.Rename(old.Writable, s.Writable); err != nil {
			return false, fmt.Errorf("oci: adopt the writable layer of %s: %w", from, err)
		}
		return true, nil
	}
	if err := os.MkdirAll(s.Writable, 0o755); err != nil {
		return false, fmt.Errorf("oci: writable layer: %w", err)
	}
	if err := syscall.Mount(old.Writable, s.Writable, "", syscall.MS_BIND, ""); err != nil {
		return false, fmt.Errorf("oci: adopt the disk of %s: bind its layer: %w", from, err)
	}
	if err := os.Rename(diskImage(old), diskImage(s)); err != nil {
		_ = syscall.Unmount(s.Writable, syscall.MNT_DETACH)
		return false, fmt.Errorf("oci: adopt the disk of %s: %w", from, err)
	}
	// The loop device stays attached through the new mount; when that goes, it goes too.
	if err := syscall.Unmount(old.Writable, syscall.MNT_DETACH); err != nil {
		d.log.Warn("adopted disk: unmount the old layer", "id", from, "err", err)
	}
	return true, nil
}

// writeLayer tars the writable layer (directories, regular files, symlinks; sockets, fifos and
// devices are skipped). Files are opened through an os.Root so that a symlink the guest
// planted cannot make the host read outside the layer. With maxBytes above 0 the files' sizes
// may add up to that much: archive/tar writes no holes, so a guest's sparse file, which costs
// it no disk, would be written whole on the host's (a 1 GiB disk holds a sparse file of 16 TiB).
func writeLayer(ctx context.Context, src, dst string, maxBytes int64) (err error) {
	root, err := os.OpenRoot(src)
	if err != nil {
		return fmt.Errorf("oci: writable layer: %w", err)
	}
	defer root.Close()
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("oci: snapshot layer: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("oci: snapshot layer: %w", cerr)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	var total int64
	walkErr := fs.WalkDir(root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = root.Readlink(p); err != nil {
				return err
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil // socket, fifo, device
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = p
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Format = tar.FormatPAX
		if fi.Mode().IsRegular() {
			rf, err := root.Open(p)
			if err != nil {
				return err
			}
			defer rf.Close()
			rfi, err := rf.Stat()
			if err != nil {
				return err
			}
			if !rfi.Mode().IsRegular() {
				return nil
			}
			if total += rfi.Size(); maxBytes > 0 && total > maxBytes {
				return layerTooBig(maxBytes, p)
			}
			hdr.Size = rfi.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if _, err := io.CopyN(tw, rf, hdr.Size); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			return nil
		}
		return tw.WriteHeader(hdr)
	})
	if walkErr != nil {
		return fmt.Errorf("oci: snapshot layer: %w", walkErr)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("oci: snapshot layer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("oci: snapshot layer: %w", err)
	}
	return f.Sync()
}

// layerTooBig is writeLayer's refusal of a layer past maxBytes, at file p.
func layerTooBig(maxBytes int64, p string) error {
	return fmt.Errorf("%w of %d bytes, at %s: a sparse file counts at its whole size (remove or shrink it, then snapshot again)",
		hypervisor.ErrLayerTooLarge, maxBytes, p)
}

// checkLayerSize answers writeLayer's refusal of src with maxBytes, from the files' sizes alone.
func checkLayerSize(src string, maxBytes int64) error {
	if maxBytes <= 0 {
		return nil
	}
	root, err := os.OpenRoot(src)
	if err != nil {
		return fmt.Errorf("oci: writable layer: %w", err)
	}
	defer root.Close()
	var total int64
	err = fs.WalkDir(root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if total += fi.Size(); total > maxBytes {
			return layerTooBig(maxBytes, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("oci: snapshot layer: %w", err)
	}
	return nil
}

// readLayer unpacks a layer tar into dst, which must be missing or empty. Everything is
// written through an os.Root: entries cannot escape dst, also not through symlinks.
func readLayer(ctx context.Context, src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return fmt.Errorf("oci: writable layer: %w", err)
	}
	if ents, err := os.ReadDir(dst); err != nil {
		return fmt.Errorf("oci: writable layer: %w", err)
	} else if len(ents) > 0 {
		return fmt.Errorf("oci: writable layer %s is not empty", dst)
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return fmt.Errorf("oci: writable layer: %w", err)
	}
	defer root.Close()
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("oci: snapshot layer: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	type dirMeta struct {
		name     string
		mode     fs.FileMode
		mtime    time.Time
		uid, gid int
	}
	var dirs []dirMeta
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("oci: snapshot layer: %w", err)
		}
		name := path.Clean(strings.TrimSuffix(hdr.Name, "/"))
		if name == "." || !fs.ValidPath(name) {
			return fmt.Errorf("oci: snapshot layer: bad entry %q", hdr.Name)
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		if hdr.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		if hdr.Mode&0o2000 != 0 {
			mode |= fs.ModeSetgid
		}
		if hdr.Mode&0o4000 != 0 {
			mode |= fs.ModeSetuid
		}
		if dirName := path.Dir(name); dirName != "." {
			if err := root.MkdirAll(dirName, 0o755); err != nil {
				return fmt.Errorf("oci: snapshot layer: %w", err)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("oci: snapshot layer: %w", err)
			}
			dirs = append(dirs, dirMeta{name, mode, hdr.ModTime, hdr.Uid, hdr.Gid})
			continue
		case tar.TypeReg:
			w, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("oci: snapshot layer: %w", err)
			}
			_, cerr := io.CopyN(w, tr, hdr.Size)
			if err := errors.Join(cerr, w.Close()); err != nil {
				return fmt.Errorf("oci: snapshot layer: %s: %w", name, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fmt.Errorf("oci: snapshot layer: %w", err)
			}
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fmt.Errorf("oci: snapshot layer: %w", err)
			}
			continue
		default:
			continue
		}
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("oci: snapshot layer: %w", err)
		}
		if err := root.Chmod(name, mode); err != nil {
			return fmt.Errorf("oci: snapshot layer: %w", err)
		}
		if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
			return fmt.Errorf("oci: snapshot layer: %w", err)
		}
	}
	// Directory modes and times last, deepest first, so that writing their entries could not
	// be refused by a read-only mode or change their mtime.
	for i := len(dirs) - 1; i >= 0; i-- {
		dm := dirs[i]
		if err := root.Lchown(dm.name, dm.uid, dm.gid); err != nil {
			return fmt.Errorf("oci: snapshot layer: %w", err)
		}
		if err := root.Chmod(dm.name, dm.mode); err != nil {
			return fmt.Errorf("oci: snapshot layer: %w", err)
		}
		if err := root.Chtimes(dm.name, dm.mtime, dm.mtime); err != nil {
			return fmt.Errorf("oci: snapshot layer: %w", err)
		}
	}
	return nil
}

// plainFileName reports whether name is one path element: not empty, not . or .., no separator.
func plainFileName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, `/\`) && filepath.IsLocal(name)
}
