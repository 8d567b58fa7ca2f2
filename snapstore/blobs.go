package snapstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrNotFound is answered by Blobs.Get for a key that holds nothing.
var ErrNotFound = errors.New("snapstore: no such object")

// Blobs is a flat key → bytes store: an S3 bucket or a local directory. Keys are
// slash-separated and never start with a slash.
type Blobs interface {
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get answers the object's content; ErrNotFound (wrapped) when there is none.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes an object; one that is not there is no error.
	Delete(ctx context.Context, key string) error
	// List answers every key that starts with prefix.
	List(ctx context.Context, prefix string) ([]string, error)
}

// Dir keeps objects as files under a directory (a shared mount, or one host's disk).
type Dir struct {
	Root string
}

func (d Dir) path(key string) (string, error) {
	if !filepath.IsLocal(filepath.FromSlash(key)) {
		return "", fmt.Errorf("snapstore: key %q is not a relative path", key)
	}
	return filepath.Join(d.Root, filepath.FromSlash(key)), nil
}

// Put writes the object through a temporary file, so a reader never sees half of it.
func (d Dir) Put(_ context.Context, key string, r io.Reader, _ int64) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".put-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("snapstore: write %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), p)
}

// Get opens the object's file.
func (d Dir) Get(_ context.Context, key string) (io.ReadCloser, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return f, err
}

// Delete removes the object's file.
func (d Dir) Delete(_ context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// List walks the directory for the files under prefix.
func (d Dir) List(_ context.Context, prefix string) ([]string, error) {
	var keys []string
	err := filepath.WalkDir(d.Root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if e.IsDir() || strings.HasPrefix(e.Name(), ".put-") {
			return nil
		}
		rel, err := filepath.Rel(d.Root, p)
		if err != nil {
			return err
		}
		if key := filepath.ToSlash(rel); strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
		return nil
	})
	return keys, err
}
