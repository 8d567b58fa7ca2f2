package guestfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"wb/hypervisor"
)

// WriteJSON writes v as indented JSON to path through a temporary file renamed over it: a
// reader finds the old record or the new one, never part of one.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ReadJSON decodes the JSON file at path into v.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}

// ReadGuest decodes guest id's record, the file at path, into v. An id that cannot be a
// guest's (hypervisor.ValidID) or a record that does not exist is hypervisor.ErrNotFound;
// errors start with driver ("oci", "cloudhv").
func ReadGuest(driver, id, path string, v any) error {
	if !hypervisor.ValidID(id) {
		return fmt.Errorf("%s: invalid guest id %q: %w", driver, id, hypervisor.ErrNotFound)
	}
	err := ReadJSON(path, v)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: guest %s: %w", driver, id, hypervisor.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("%s: guest %s record: %w", driver, id, err)
	}
	return nil
}

// Allocated is the space file path takes on disk (a sparse image: its written blocks), -1
// when it cannot be read.
func Allocated(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return -1
	}
	return allocated(fi)
}

func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// DiskUsage is the space dir and everything under it take on disk (a missing dir: 0), -1
// when it cannot be walked.
func DiskUsage(dir string) int64 {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return nil //nolint:nilerr // vanished while walking
		}
		total += allocated(fi)
		return nil
	})
	if err != nil {
		return -1
	}
	return total
}
