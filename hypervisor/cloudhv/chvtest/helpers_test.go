package chvtest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/cloudhv/chvtest"
	"wb/internal/syncbuf"
	"wb/internal/wbbin"
)

// shared holds what every test uses: the guest's init, the root image, the fake's binary.
var shared struct {
	dir       string
	rootImage string
	fakech    string
	kernel    string
}

func TestMain(m *testing.M) {
	err := setup()
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, "chvtest setup:", err)
	} else {
		code = m.Run()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// setup builds the guest's init (a static Go program), the fake's command and the root image
// (busybox-static plus the init, made with mkfs.ext4 -d).
func setup() error {
	if os.Geteuid() != 0 {
		return errors.New("the fake's tests need root (loop mounts and runc)")
	}
	for _, tool := range []string{"runc", "mkfs.ext4", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (apt-get install runc e2fsprogs mount): %w", tool, err)
		}
	}
	busybox := "/bin/busybox"
	if _, err := os.Stat(busybox); err != nil {
		return fmt.Errorf("busybox-static is not installed (apt-get install busybox-static): %w", err)
	}
	dir, err := os.MkdirTemp("", "chvtest-")
	if err != nil {
		return err
	}
	shared.dir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	root := filepath.Join(dir, "root")
	for _, d := range []string{"bin", "sbin", "proc", "dev", "sys", "tmp", "root", "workspace", "run/wb-bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	build := exec.Command("go", "build", "-o", filepath.Join(root, "sbin", "guestinit"), "./testdata/guestinit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the guest's init: %w: %s", err, out)
	}
	if shared.fakech, err = wbbin.FakeCH(dir); err != nil {
		return err
	}
	if err := run("cp", busybox, filepath.Join(root, "bin", "busybox")); err != nil {
		return err
	}
	for _, applet := range []string{"sh", "sleep", "cat", "ls"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			return err
		}
	}
	// The contract's wb binary in the image; the tests' init is guestinit.
	if err := os.WriteFile(filepath.Join(root, "run", "wb-bin", "wb"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		return err
	}
	shared.rootImage = filepath.Join(dir, "rootfs.img")
	if err := run("mkfs.ext4", "-q", "-d", root, shared.rootImage, "64M"); err != nil {
		return err
	}
	shared.kernel = filepath.Join(dir, "vmlinux")
	if err := os.WriteFile(shared.kernel, []byte("not a kernel: the fake's guest is a runc container\n"), 0o644); err != nil {
		return err
	}
	return nil
}

// reachableTempDir is a t.TempDir that runc's guest root (host uid 100000) can search.
func reachableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// writableImage makes the guest's writable layer: an ext4 image whose root holds workspace/,
// tmp/ and root/.
func writableImage(t testing.TB, dir string) string {
	t.Helper()
	src := filepath.Join(dir, "writable-src")
	for _, d := range []string{"workspace", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(dir, "writable.img")
	if err := run("mkfs.ext4", "-q", "-d", src, img, "32M"); err != nil {
		t.Fatal(err)
	}
	return img
}

type event struct {
	Timestamp struct {
		Secs  *int64 `json:"secs"`
		Nanos *int64 `json:"nanos"`
	} `json:"timestamp"`
	Source     string            `json:"source"`
	Event      string            `json:"event"`
	Properties map[string]string `json:"properties"`
}

func (e event) String() string { return e.Source + "/" + e.Event }

// parseEvents decodes concatenated JSON objects, as a client of CH's event monitor must.
func parseEvents(t testing.TB, b []byte) []event {
	t.Helper()
	var out []event
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		var e event
		if err := dec.Decode(&e); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatalf("event stream %q: %v", b, err)
		}
		if e.Timestamp.Secs == nil || e.Timestamp.Nanos == nil {
			t.Fatalf("event %v without timestamp secs/nanos", e)
		}
		out = append(out, e)
	}
}

// fake is one in-process VMM under test.
type fake struct {
	t        testing.TB
	v        *chvtest.VMM
	dir      string // the test's dir: images, snapshots, sockets
	stateDir string
	sock     string
	vsock    string
	writable string
	events   *syncbuf.Buffer
	client   *http.Client
	done     chan error
	cancel   context.CancelFunc
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// unixClient talks HTTP over the API socket.
func unixClient(sock string) *http.Client {
	return &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

// listening reports whether a server accepts on the unix socket. The file alone is not enough:
// it exists from bind(2), and a connect before listen(2) is refused (CI saw this once).
func listening(sock string) bool {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// startFake serves a VMM in this process; the test's cleanup shuts it down and checks that
// it answered only what the document allows and left no mount, loop device or container.
func startFake(t testing.TB) *fake {
	t.Helper()
	return startFakeWith(t, func(*chvtest.Options) {})
}

// startFakeWith is startFake with options changed by edit.
func startFakeWith(t testing.TB, edit func(*chvtest.Options)) *fake {
	t.Helper()
	dir := reachableTempDir(t)
	f := &fake{t: t, dir: dir, stateDir: filepath.Join(dir, "state"), sock: filepath.Join(dir, "api.sock"),
		vsock: filepath.Join(dir, "vsock.sock"), events: &syncbuf.Buffer{}, done: make(chan error, 1)}
	f.writable = writableImage(t, dir)
	o := chvtest.Options{APISocket: f.sock, Events: f.events, StateDir: f.stateDir, Logger: testLogger(t)}
	edit(&o)
	v, err := chvtest.New(o)
	if err != nil {
		t.Fatal(err)
	}
	f.v = v
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() { f.done <- v.Serve(ctx) }()
	f.client = unixClient(f.sock)
	waitFor(t, 30*time.Second, "the API socket", func() bool { return listening(f.sock) })
	t.Cleanup(func() {
		f.cancel()
		select {
		case err := <-f.done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("Serve did not return within 2m of its context's end")
		}
		if n := f.v.BadResponses(); n > 0 {
			t.Errorf("the fake sent %d answers that cloud-hypervisor.yaml does not allow (see the log)", n)
		}
		checkNoLeaks(t, f.stateDir, f.writable)
	})
	return f
}

// checkNoLeaks: nothing mounted below stateDir, no loop device on the images, no container.
func checkNoLeaks(t testing.TB, stateDir string, images ...string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, stateDir) {
			t.Errorf("mount left behind: %s", line)
		}
	}
	for _, img := range append(images, shared.rootImage) {
		// A busy disk is detached lazily (unmount's MNT_DETACH): its loop device goes once
		// the guest's last process has, a moment after the VM was deleted on a loaded host.
		var out []byte
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			var err error
			if out, err = exec.Command("losetup", "-j", img).CombinedOutput(); err != nil {
				t.Errorf("losetup -j %s: %v: %s", img, err, out)
			}
			// The root image is shared by tests that may run in parallel: only this test's
			// state dir matters there, checked through the mounts above.
			if img == shared.rootImage || strings.TrimSpace(string(out)) == "" || err != nil || time.Now().After(deadline) {
				break
			}
		}
		if img != shared.rootImage && strings.TrimSpace(string(out)) != "" {
			t.Errorf("loop device left on %s 15 s after the VM went: %s", img, out)
		}
	}
	out, err := exec.Command("runc", "--root", filepath.Join(stateDir, "runc"), "list", "-q").CombinedOutput()
	if err != nil {
		t.Errorf("runc list: %v: %s", err, out)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("runc containers left behind: %s", s)
	}
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// do sends one API request and returns the status and body.
func (f *fake) do(method, op, body string) (int, string) {
	f.t.Helper()
	return doRequest(f.t, f.client, method, op, body)
}

func doRequest(t testing.TB, c *http.Client, method, op, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://localhost/api/v1/"+op, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, op, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// must sends a request that must answer want.
func (f *fake) must(method, op, body string, want int) string {
	f.t.Helper()
	code, b := f.do(method, op, body)
	if code != want {
		f.t.Fatalf("%s %s: %d %s, want %d", method, op, code, b, want)
	}
	return b
}

// config is a VmConfig as the driver sends it.
func (f *fake) config(cmdlineExtra string) string {
	cfg := map[string]any{
		"payload": map[string]any{"kernel": shared.kernel,
			"cmdline": "console=hvc0 root=/dev/vda ro init=/sbin/guestinit WB_TEST=yes " + cmdlineExtra + " -- agent --vsock-port 1024"},
		"cpus":   map[string]any{"boot_vcpus": 1, "max_vcpus": 2},
		"memory": map[string]any{"size": 256 << 20},
		"disks": []any{
			map[string]any{"id": "rootfs", "path": shared.rootImage, "readonly": true},
			map[string]any{"id": "writable", "path": f.writable},
		},
		"vsock": map[string]any{"cid": 3, "socket": f.vsock},
	}
	b, _ := json.Marshal(cfg)
	return string(b)
}

func (f *fake) boot() {
	f.t.Helper()
	f.must("PUT", "vm.create", f.config(""), 204)
	f.must("PUT", "vm.boot", "", 204)
}

// vsockDial connects through the hybrid vsock socket: "CONNECT port\n", then "OK n\n".
func vsockDial(t testing.TB, sock string, port int) (net.Conn, *bufio.Reader, string, error) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, nil, "", err
	}
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		c.Close()
		return nil, nil, "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, nil, line, err
	}
	return c, r, line, nil
}

// agent connects to the guest's port 1024, retrying until the guest listens.
func (f *fake) agent() (net.Conn, *bufio.Reader) {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, r, line, err := vsockDial(f.t, f.vsock, 1024)
		if err == nil {
			if !strings.HasPrefix(line, "OK ") {
				f.t.Fatalf("CONNECT 1024: answered %q, want OK <port>", line)
			}
			return c, r
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("CONNECT 1024: %v (answer %q)", err, line)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ask(t testing.TB, c net.Conn, r *bufio.Reader, line string) string {
	t.Helper()
	if _, err := fmt.Fprintln(c, line); err != nil {
		t.Fatal(err)
	}
	out, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("guest: %q: %v", line, err)
	}
	return strings.TrimSuffix(out, "\n")
}

// counterFile is the guest's counter as the host sees it in the mounted writable layer.
func (f *fake) counter() string {
	f.t.Helper()
	m, _ := filepath.Glob(filepath.Join(f.stateDir, "chv-*", "writable", "workspace", "counter"))
	if len(m) != 1 {
		return ""
	}
	b, _ := os.ReadFile(m[0])
	return string(b)
}

func timeAfter() <-chan time.Time { return time.After(2 * time.Minute) }
