package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// FileName is the lock file inside a data directory. It is never removed: removing it while
// another process waits on it would let two processes lock two different files of one name.
const FileName = "wb.lock"

// Holder is what the lock file says about the process holding it.
type Holder struct {
	PID     int       `json:"pid"`
	Command string    `json:"command"`
	Since   time.Time `json:"since"`
}

// HeldError says that another process holds the directory's lock.
type HeldError struct {
	Dir string
	// Holder is zero when the holder has not written its details yet (it took the lock
	// an instant ago).
	Holder Holder
}

func (e *HeldError) Error() string {
	who := "another process (its pid is not written yet)"
	if e.Holder.PID > 0 {
		who = fmt.Sprintf("%s (pid %d, since %s)", e.Holder.Command, e.Holder.PID, e.Holder.Since.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("data dir %s is in use by %s: one wb serve or wb node per data dir; stop that one, or give this one another --data-dir", e.Dir, who)
}

// Lock is a held data directory lock.
type Lock struct {
	f *os.File
}

// Acquire creates dir if needed and takes its lock for command (say "wb serve"), without
// waiting: when another process holds it, it answers a *HeldError naming that process.
func Acquire(dir, command string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, FileName)
	// os.OpenFile sets O_CLOEXEC: the runtimes wb starts (whose sandboxes outlive it) must not
	// inherit the descriptor, or the lock would outlive wb too.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := flock(f); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Dir: dir, Holder: readHolder(f)}
		}
		return nil, fmt.Errorf("data dir lock %s: %w", path, err)
	}
	b, err := json.Marshal(Holder{PID: os.Getpid(), Command: command, Since: time.Now().UTC().Truncate(time.Second)})
	if err == nil {
		// Write, then cut: a reader never finds the file empty, only a complete first value.
		if _, err = f.WriteAt(append(b, '\n'), 0); err == nil {
			err = f.Truncate(int64(len(b) + 1))
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir lock %s: write the holder: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Release gives the directory up. Ending the process does the same.
func (l *Lock) Release() error {
	_ = l.f.Truncate(0) // no stale holder for the next reader
	return l.f.Close()
}

func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// readHolder decodes the file's first JSON value; anything else reads as an unknown holder.
func readHolder(f *os.File) Holder {
	var h Holder
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Holder{}
	}
	if err := json.NewDecoder(f).Decode(&h); err != nil {
		return Holder{}
	}
	return h
}
