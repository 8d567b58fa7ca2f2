package wbbin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// EnvVar names a prebuilt static wb binary (CGO_ENABLED=0 go build ./cmd/wb) to use instead
// of building one.
const EnvVar = "WB_TEST_BIN"

// Install puts a static wb binary at dir/wb (mode 0755) and answers its path: a copy of the
// one named by WB_TEST_BIN, or one built from the module that holds the calling test's
// package. A copy, not the named file: the caller chose dir so that a guest's unprivileged
// user can reach it.
func Install(dir string) (string, error) {
	out := filepath.Join(dir, "wb")
	if src := os.Getenv(EnvVar); src != "" {
		if err := copyFile(src, out); err != nil {
			return "", fmt.Errorf("%s=%s: %w (unset it to build wb instead)", EnvVar, src, err)
		}
		return out, nil
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	// The package path, not a directory: it resolves from any package of the module.
	cmd := exec.Command(gobin, "build", "-o", out, "wb/cmd/wb")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // guests run it: it must be static
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build wb: %w\n%s", err, b)
	}
	return out, nil
}

func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return errors.New("not a regular file")
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	return out.Chmod(0o755) // whatever the umask

}
