package snapstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

// Manifest lists a snapshot's files. It is written after all of them, so its presence says
// the snapshot is complete.
type Manifest struct {
	SnapshotID string `json:"snapshot_id"`
	Files      []File `json:"files"`
}

// File is one file of a snapshot: its path inside the snapshot's directory, its content's
// SHA-256 (hex), size and permission bits.
type File struct {
	Path   string      `json:"path"`
	SHA256 string      `json:"sha256"`
	Size   int64       `json:"size"`
	Mode   fs.FileMode `json:"mode"`
}

// Bytes answers the manifest's total file size.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// DigestError says a downloaded object does not hold what the manifest names: the store's
// copy is corrupt (or was replaced), and the snapshot cannot be restored from it.
type DigestError struct {
	SnapshotID, Path, Want, Got string
	WantSize, GotSize           int64
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("snapstore: snapshot %s: file %s: the object store holds %d bytes with sha256 %s, the manifest says %d bytes with sha256 %s; the stored copy is corrupt: take a new snapshot",
		e.SnapshotID, e.Path, e.GotSize, e.Got, e.WantSize, e.Want)
}

// Store keeps snapshots' files in Blobs.
type Store struct {
	Blobs Blobs
	// Name says where, for logs and errors (s3://bucket/prefix, file:///dir).
	Name string
}

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

func snapshotPrefix(id string) string { return "snapshots/" + id + "/" }
func manifestKey(id string) string    { return snapshotPrefix(id) + "manifest.json" }
func blobKey(id, sum string) string   { return snapshotPrefix(id) + "sha256/" + sum }

// Put uploads every regular file under dir as snapshot id, then its manifest. A snapshot
// directory holds only regular files and directories; anything else is refused.
func (s *Store) Put(ctx context.Context, id, dir string) (Manifest, error) {
	m := Manifest{SnapshotID: id}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if !e.Type().IsRegular() {
			return fmt.Errorf("snapstore: snapshot %s: %s is not a regular file; a snapshot holds only files", id, rel)
		}
		f, err := s.putFile(ctx, id, p)
		if err != nil {
			return err
		}
		f.Path = filepath.ToSlash(rel)
		m.Files = append(m.Files, f)
		return nil
	})
	if err != nil {
		return Manifest{}, err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return Manifest{}, err
	}
	if err := s.Blobs.Put(ctx, manifestKey(id), bytes.NewReader(b), int64(len(b))); err != nil {
		return Manifest{}, fmt.Errorf("snapstore: snapshot %s: manifest: %w", id, err)
	}
	return m, nil
}

// putFile hashes a file, then uploads it under its digest.
func (s *Store) putFile(ctx context.Context, id, p string) (File, error) {
	f, err := os.Open(p)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return File{}, fmt.Errorf("snapstore: hash %s: %w", p, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return File{}, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if n == 0 { // nothing to store (and some S3 servers refuse an empty streamed upload)
		return File{SHA256: sum, Mode: st.Mode().Perm()}, nil
	}
	if err := s.Blobs.Put(ctx, blobKey(id, sum), io.LimitReader(f, n), n); err != nil {
		return File{}, fmt.Errorf("snapstore: snapshot %s: %w", id, err)
	}
	return File{SHA256: sum, Size: n, Mode: st.Mode().Perm()}, nil
}

// Manifest reads snapshot id's manifest: ErrNotFound (wrapped) when the snapshot was never
// completely uploaded, or was deleted.
func (s *Store) Manifest(ctx context.Context, id string) (Manifest, error) {
	rc, err := s.Blobs.Get(ctx, manifestKey(id))
	if err != nil {
		return Manifest{}, fmt.Errorf("snapstore: snapshot %s in %s: %w", id, s.Name, err)
	}
	defer rc.Close()
	var m Manifest
	if err := json.NewDecoder(io.LimitReader(rc, 16<<20)).Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("snapstore: snapshot %s: manifest: %w", id, err)
	}
	if m.SnapshotID != id {
		return Manifest{}, fmt.Errorf("snapstore: snapshot %s: manifest names snapshot %q", id, m.SnapshotID)
	}
	for _, f := range m.Files {
		if !filepath.IsLocal(filepath.FromSlash(f.Path)) || !hexDigest.MatchString(f.SHA256) || f.Size < 0 {
			return Manifest{}, fmt.Errorf("snapstore: snapshot %s: manifest entry %q is not a relative path with a sha256", id, f.Path)
		}
	}
	return m, nil
}

// Get downloads snapshot id into dir, which must not exist yet: into a temporary directory
// beside it, each file checked against the manifest's size and digest, then renamed to dir.
// If dir appeared meanwhile (another download of the same snapshot), that one is kept.
func (s *Store) Get(ctx context.Context, id, dir string) (Manifest, error) {
	m, err := s.Manifest(ctx, id)
	if err != nil {
		return Manifest{}, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return Manifest{}, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".fetch-"+filepath.Base(dir)+"-")
	if err != nil {
		return Manifest{}, err
	}
	defer os.RemoveAll(tmp)
	for _, f := range m.Files {
		if err := s.getFile(ctx, id, f, filepath.Join(tmp, filepath.FromSlash(f.Path))); err != nil {
			return Manifest{}, err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(dir); serr == nil {
			return m, nil
		}
		return Manifest{}, err
	}
	return m, nil
}

func (s *Store) getFile(ctx context.Context, id string, f File, p string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	var rc io.ReadCloser = io.NopCloser(bytes.NewReader(nil)) // an empty file has no object
	if f.Size > 0 {
		var err error
		if rc, err = s.Blobs.Get(ctx, blobKey(id, f.SHA256)); err != nil {
			return fmt.Errorf("snapstore: snapshot %s: file %s: %w", id, f.Path, err)
		}
	}
	defer rc.Close()
	out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, f.Mode.Perm()|0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	// One byte more than the manifest says is enough to see a longer object.
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(rc, f.Size+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("snapstore: snapshot %s: download %s: %w", id, f.Path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != f.Size || got != f.SHA256 {
		return &DigestError{SnapshotID: id, Path: f.Path, Want: f.SHA256, Got: got, WantSize: f.Size, GotSize: n}
	}
	return nil
}

// Delete removes snapshot id: its manifest first (it is no longer restorable from then on),
// then every object under its prefix, including those of an upload that never finished.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := s.Blobs.Delete(ctx, manifestKey(id)); err != nil {
		return err
	}
	keys, err := s.Blobs.List(ctx, snapshotPrefix(id))
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range keys {
		errs = append(errs, s.Blobs.Delete(ctx, k))
	}
	return errors.Join(errs...)
}
