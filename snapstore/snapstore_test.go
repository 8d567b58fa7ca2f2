package snapstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"wb/snapstore"
	"wb/snapstore/s3test"
)

// backends answers each store kind over a fresh bucket or directory. With
// WB_TEST_SNAPSHOT_STORE set to an s3:// store URL (credentials from AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY), the same tests also run against that server, e.g. SeaweedFS's
// `weed server -s3` (too slow to build for make test: see the README).
func backends(t *testing.T) map[string]*snapstore.Store {
	t.Helper()
	dir, err := snapstore.Open(context.Background(), "file://"+t.TempDir(), s3test.Env)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*snapstore.Store{"s3": s3test.Start(t).Open(t), "dir": dir}
	if u := os.Getenv("WB_TEST_SNAPSHOT_STORE"); u != "" {
		ext, err := snapstore.Open(context.Background(), u, os.Getenv)
		if err != nil {
			t.Fatalf("WB_TEST_SNAPSHOT_STORE: %v", err)
		}
		out["external"] = ext
	}
	return out
}

// writeSnapshot makes a snapshot directory with a nested file, an empty one and a big one.
func writeSnapshot(t *testing.T, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for p, b := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func sampleFiles() map[string][]byte {
	return map[string][]byte{
		"meta.json":        []byte(`{"format":1}`),
		"layer.tar":        bytes.Repeat([]byte("layer-"), 1<<20), // > one multipart part
		"memory/pages.img": []byte("pages"),
		"empty":            {},
	}
}

func checkFiles(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	for p, b := range want {
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			t.Fatalf("restored %s: %v", p, err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("restored %s: %d bytes differ from the %d taken", p, len(got), len(b))
		}
	}
}

func TestPutGetDelete(t *testing.T) {
	ctx := context.Background()
	for name, st := range backends(t) {
		t.Run(name, func(t *testing.T) {
			files := sampleFiles()
			m, err := st.Put(ctx, "snap_a", writeSnapshot(t, files))
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Files) != len(files) {
				t.Fatalf("manifest lists %d files, want %d", len(m.Files), len(files))
			}
			// The manifest round-trips: read back, it names the same files and digests.
			back, err := st.Manifest(ctx, "snap_a")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(back.Files, m.Files) {
				t.Fatalf("manifest read back %+v, put %+v", back.Files, m.Files)
			}
			to := filepath.Join(t.TempDir(), "cache", "snap_a")
			if _, err := st.Get(ctx, "snap_a", to); err != nil {
				t.Fatal(err)
			}
			checkFiles(t, to, files)
			if fi, err := os.Stat(filepath.Join(to, "meta.json")); err != nil || fi.Mode().Perm() != 0o640 {
				t.Fatalf("restored mode: %v %v, want 0640", fi.Mode(), err)
			}
			if err := st.Delete(ctx, "snap_a"); err != nil {
				t.Fatal(err)
			}
			if keys, err := st.Blobs.List(ctx, ""); err != nil || len(keys) != 0 {
				t.Fatalf("after delete the store holds %v (%v), want nothing", keys, err)
			}
			if _, err := st.Get(ctx, "snap_a", filepath.Join(t.TempDir(), "again")); !errors.Is(err, snapstore.ErrNotFound) {
				t.Fatalf("get of a deleted snapshot: %v, want ErrNotFound", err)
			}
		})
	}
}

// A corrupt object fails the download with a DigestError, and leaves no directory behind.
func TestCorruptObjectRefused(t *testing.T) {
	ctx := context.Background()
	for name, st := range backends(t) {
		t.Run(name, func(t *testing.T) {
			m, err := st.Put(ctx, "snap_c", writeSnapshot(t, sampleFiles()))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range m.Files {
				if f.Path != "memory/pages.img" {
					continue
				}
				bad := []byte("PAGES") // same size, other content
				if err := st.Blobs.Put(ctx, "snapshots/snap_c/sha256/"+f.SHA256, bytes.NewReader(bad), int64(len(bad))); err != nil {
					t.Fatal(err)
				}
			}
			to := filepath.Join(t.TempDir(), "snap_c")
			_, err = st.Get(ctx, "snap_c", to)
			var de *snapstore.DigestError
			if !errors.As(err, &de) || de.Path != "memory/pages.img" || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("get of a corrupt snapshot: %v, want a DigestError naming memory/pages.img", err)
			}
			if _, err := os.Stat(to); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a failed get left %s: %v", to, err)
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(to), ".fetch-*")); len(left) != 0 {
				t.Fatalf("a failed get left %v", left)
			}
		})
	}
}

// A snapshot whose manifest was never written (its upload did not finish) is not found.
func TestUnfinishedUploadNotFound(t *testing.T) {
	ctx := context.Background()
	st := s3test.Start(t).Open(t)
	if err := st.Blobs.Put(ctx, "snapshots/snap_u/sha256/"+strings.Repeat("0", 64), strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "snap_u", filepath.Join(t.TempDir(), "snap_u")); !errors.Is(err, snapstore.ErrNotFound) {
		t.Fatalf("get of an unfinished upload: %v, want ErrNotFound", err)
	}
	// Its delete still removes the orphaned blob.
	if err := st.Delete(ctx, "snap_u"); err != nil {
		t.Fatal(err)
	}
	if keys, _ := st.Blobs.List(ctx, ""); len(keys) != 0 {
		t.Fatalf("after delete the store holds %v", keys)
	}
}

// The sharing rule: two snapshots with identical files each keep their own copy, so deleting
// one leaves the other restorable.
func TestIdenticalSnapshotsIndependent(t *testing.T) {
	ctx := context.Background()
	st := s3test.Start(t).Open(t)
	files := sampleFiles()
	for _, id := range []string{"snap_1", "snap_2"} {
		if _, err := st.Put(ctx, id, writeSnapshot(t, files)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Delete(ctx, "snap_1"); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "snap_2")
	if _, err := st.Get(ctx, "snap_2", to); err != nil {
		t.Fatalf("snap_2 after deleting its twin snap_1: %v", err)
	}
	checkFiles(t, to, files)
}

func TestOpenRefusesBadURLs(t *testing.T) {
	srv := s3test.Start(t)
	for _, u := range []string{
		"ftp://x",
		"s3://?endpoint=" + srv.URL,
		"s3://nosuchbucket?endpoint=" + srv.URL,
		"s3://snapshots?endpoint=127.0.0.1:1",
		"file://relative/dir",
	} {
		if _, err := snapstore.Open(context.Background(), u, s3test.Env); err == nil {
			t.Errorf("Open(%q) succeeded; want an error", u)
		}
	}
	noEnv := func(string) string { return "" }
	if _, err := snapstore.Open(context.Background(), srv.StoreURL(), noEnv); err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("Open without credentials: %v, want an error naming AWS_ACCESS_KEY_ID", err)
	}
}
