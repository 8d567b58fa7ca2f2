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

// EnvVar names a prebuilt wb binary (go build ./cmd/wb) to run as a server instead of
// building one.
const EnvVar = "WB_TEST_BIN"

// AgentEnvVar names a prebuilt static agent binary (CGO_ENABLED=0 go build ./cmd/wb-agent) to
// put in guests instead of building one.
const AgentEnvVar = "WB_TEST_AGENT_BIN"

// Install puts wb at dir/wb and the static agent at dir/wb-agent (mode 0755), where wb looks
// for its guests' agent, and answers wb's path: copies of the binaries named by WB_TEST_BIN
// and WB_TEST_AGENT_BIN, or builds from the module that holds the calling test's package.
// Copies, not the named files: the caller chose dir so that a guest's unprivileged user can
// reach them.
func Install(dir string) (string, error) {
	if _, err := Agent(dir); err != nil {
		return "", err
	}
	return install(dir, "wb", EnvVar, "wb/cmd/wb")
}

// Agent puts the static agent binary at dir/wb-agent (mode 0755): a copy of the one named by
// WB_TEST_AGENT_BIN, or one built from cmd/wb-agent. It answers its path.
func Agent(dir string) (string, error) {
	return install(dir, "wb-agent", AgentEnvVar, "wb/cmd/wb-agent")
}

func install(dir, name, envVar, pkg string) (string, error) {
	out := filepath.Join(dir, name)
	if src := os.Getenv(envVar); src != "" {
		if err := copyFile(src, out); err != nil {
			return "", fmt.Errorf("%s=%s: %w (unset it to build %s instead)", envVar, src, err, pkg)
		}
		return out, nil
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	// The package path, not a directory: it resolves from any package of the module.
	cmd := exec.Command(gobin, "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static: guests run the agent, and wb may be their agent
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", pkg, err, b)
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

// FakeCHEnvVar names a prebuilt fake Cloud Hypervisor (go build [-race]
// ./hypervisor/cloudhv/chvtest/fakech; it runs on the host only, so it may be dynamic) to use
// instead of building one.
const FakeCHEnvVar = "WB_TEST_FAKECH"

// FakeCH puts the fake Cloud Hypervisor command at dir/fakech (mode 0755) and answers its
// path: a copy of the one WB_TEST_FAKECH names, or one built static, as wb is, so that a cold
// build shares wb's compiled packages instead of compiling them again for cgo.
func FakeCH(dir string) (string, error) {
	return install(dir, "fakech", FakeCHEnvVar, "wb/hypervisor/cloudhv/chvtest/fakech")
}
