package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// resolvePath makes p absolute against root (an empty p is root itself) and cleans it. There is
// no confinement to root: the guest is the boundary, and absolute paths are allowed anyway.
func resolvePath(root, p, param string) (string, *Error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", badRequest(param, "%s contains a NUL byte", param)
	}
	if p == "" {
		return root, nil
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(root, p)
	}
	return filepath.Clean(p), nil
}

// filePath reads the required ?path= of a files request.
func (s *server) filePath(r *http.Request) (string, *Error) {
	q := r.URL.Query()
	if !q.Has("path") || q.Get("path") == "" {
		return "", badRequest("path", "the query parameter path is required")
	}
	return resolvePath(s.root, q.Get("path"), "path")
}

// fsError maps a filesystem error to an API error.
func fsError(err error, path string) *Error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &Error{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("%s does not exist", path), Param: "path"}
	case errors.Is(err, fs.ErrPermission):
		return &Error{Status: http.StatusForbidden, Code: "forbidden", Message: fmt.Sprintf("%s: permission denied", path), Param: "path"}
	case errors.Is(err, syscall.ENOTDIR):
		return badRequest("path", "%s: a parent is not a directory", path)
	case errors.Is(err, syscall.EISDIR):
		return badRequest("path", "%s is a directory", path)
	case errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EEXIST):
		return &Error{Status: http.StatusConflict, Code: "not_empty", Message: fmt.Sprintf("%s is a directory that is not empty", path), Param: "path"}
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &Error{Status: http.StatusInsufficientStorage, Code: "no_space", Message: fmt.Sprintf("%s: no space left on the guest's disk", path), Param: "path"}
	default:
		return &Error{Status: http.StatusInternalServerError, Code: "internal", Message: err.Error(), Param: "path"}
	}
}

func (s *server) handleFileGet(w http.ResponseWriter, r *http.Request) {
	path, apiErr := s.filePath(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	list := r.URL.Query().Get("list")
	if list != "" && list != "0" && list != "1" {
		writeAPIError(w, badRequest("list", "list must be 0 or 1, got %q", list))
		return
	}
	fi, err := os.Stat(path)
	if err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	if list == "1" {
		if !fi.IsDir() {
			writeAPIError(w, badRequest("path", "%s is not a directory (list=1 lists a directory)", path))
			return
		}
		s.listDir(w, path)
		return
	}
	if fi.IsDir() {
		writeAPIError(w, badRequest("path", "%s is a directory; add list=1 to list it", path))
		return
	}
	if !fi.Mode().IsRegular() {
		writeAPIError(w, badRequest("path", "%s is not a regular file (%s)", path, fi.Mode().Type()))
		return
	}
	f, err := os.Open(path)
	if err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	if fi.Size() > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		_, _ = io.CopyN(w, f, fi.Size())
		return
	}
	// Size 0 may be a pseudo-file (/proc) whose content has no stated size: stream it, bounded.
	_, _ = io.Copy(w, io.LimitReader(f, MaxFileBytes))
}

// listDir answers the directory's entries by name, reading them a batch at a time: one of
// more than maxListEntries (the client's bound too) is answered 413 as soon as the reading
// passes it, rather than read whole into memory first.
func (s *server) listDir(w http.ResponseWriter, path string) {
	f, err := os.Open(path)
	if err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	defer f.Close()
	out := []FileInfo{}
	for {
		entries, err := f.ReadDir(1024)
		for _, e := range entries {
			fi, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			if len(out) == maxListEntries {
				writeAPIError(w, errListTooLarge())
				return
			}
			out = append(out, FileInfo{
				Name:      e.Name(),
				Size:      fi.Size(),
				Mode:      fmt.Sprintf("%04o", unixPerm(fi.Mode())),
				IsDir:     fi.IsDir(),
				IsSymlink: fi.Mode()&fs.ModeSymlink != 0,
				ModTime:   fi.ModTime().UTC(),
			})
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeAPIError(w, fsError(err, path))
			return
		}
	}
	slices.SortFunc(out, func(a, b FileInfo) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(w, http.StatusOK, out)
}

// unixPerm is the mode's permission bits with setuid, setgid and sticky as in chmod(1).
func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		p |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		p |= 0o1000
	}
	return p
}

// handleFilePut writes the body to path atomically: a temporary file in the same directory,
// synced, then renamed over path. Parents are created. ?mode=0755 sets the permissions
// (default: those of the file replaced, else 0644).
func (s *server) handleFilePut(w http.ResponseWriter, r *http.Request) {
	path, apiErr := s.filePath(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			writeAPIError(w, badRequest("path", "%s is a directory", path))
			return
		}
		mode = fi.Mode().Perm()
	}
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o777 {
			writeAPIError(w, badRequest("mode", "mode must be octal permissions 0–0777, got %q", m))
			return
		}
		mode = fs.FileMode(v)
	}
	if r.ContentLength > MaxFileBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the file is %d bytes; at most %d", r.ContentLength, MaxFileBytes), "body")
		return
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		writeAPIError(w, fsError(err, dir))
		return
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".wb-tmp-*")
	if err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	committed := false
	defer func() {
		if !committed {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	n, err := io.Copy(tmp, http.MaxBytesReader(w, r.Body, MaxFileBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the file is larger than %d bytes", MaxFileBytes), "body")
			return
		}
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			writeAPIError(w, fsError(err, path))
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request", "cannot read the body: "+err.Error(), "body")
		return
	}
	if err := tmp.Chmod(mode); err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	if err := tmp.Sync(); err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	if err := tmp.Close(); err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		committed = true
		writeAPIError(w, fsError(err, path))
		return
	}
	committed = true
	writeJSON(w, http.StatusOK, map[string]any{"path": path, "size": n})
}

func (s *server) handleFileDelete(w http.ResponseWriter, r *http.Request) {
	path, apiErr := s.filePath(r)
	if apiErr != nil {
		writeAPIError(w, apiErr)
		return
	}
	if err := os.Remove(path); err != nil {
		writeAPIError(w, fsError(err, path))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
