package templates

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"wb/hypervisor"
)

// Template names.
const (
	Base          = "tpl_base"
	DevPolyglot   = "tpl_dev_polyglot"
	Desktop       = "tpl_desktop"
	defaultPATH   = "PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	rootfsDirName = "rootfs"
)

// Runtime is a language or tool a template can run a snippet with: the guest command line is
// Argv followed by the snippet (e.g. ["/usr/bin/python3", "-c"] + ["print(1)"]).
type Runtime struct {
	Name string   `json:"name"`
	Argv []string `json:"argv"`
	// Version is what the runtime says its version is ("3.11.7"), empty when unknown: a run
	// may ask for a version ("python3.11", session.Catalog.Runtime).
	Version string `json:"version,omitempty"`
}

// Template is one assembled template.
type Template struct {
	Name     string            `json:"name"`
	Digest   string            `json:"digest"` // "sha256:" + hex over the rootfs tree and the binds
	RootFS   string            `json:"rootfs"` // mount read-only
	Binds    []hypervisor.Bind `json:"binds,omitempty"`
	Env      []string          `json:"env"`
	Runtimes []Runtime         `json:"runtimes"`
}

// Catalog maps template names to templates.
type Catalog map[string]Template

// Names returns the catalog's template names, sorted.
func (c Catalog) Names() []string {
	out := make([]string, 0, len(c))
	for n := range c {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Options tune Assemble; the zero value suits a Debian host.
type Options struct {
	// Busybox is the static busybox binary; default /bin/busybox, else /usr/bin/busybox.
	Busybox string
	// HostRoot is where host toolchains are looked for; default "/". Binds use paths below it.
	HostRoot string
}

// Assemble builds tpl_base and tpl_dev_polyglot under dir with the default options.
func Assemble(dir string) (Catalog, error) { return AssembleWith(dir, Options{}) }

// AssembleWith builds the templates under dir.
func AssembleWith(dir string, o Options) (Catalog, error) {
	if o.HostRoot == "" {
		o.HostRoot = "/"
	}
	if o.Busybox == "" {
		for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
			if _, err := os.Stat(p); err == nil {
				o.Busybox = p
				break
			}
		}
		if o.Busybox == "" {
			return nil, errors.New("templates: no busybox (Debian: apt-get install busybox-static)")
		}
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	applets, err := busyboxApplets(o.Busybox)
	if err != nil {
		return nil, err
	}
	cat := Catalog{}

	base, err := build(dir, Base, nil, func(root string) error { return writeBase(root, o.Busybox, applets) })
	if err != nil {
		return nil, err
	}
	base.Env = []string{defaultPATH, "HOME=/root"}
	base.Runtimes = []Runtime{{Name: "sh", Argv: []string{"/bin/sh", "-c"}}}
	cat[base.Name] = base

	tc := detectToolchains(o.HostRoot)
	poly, err := build(dir, DevPolyglot, tc.binds, func(root string) error {
		if err := writeBaseWithLinks(root, o.Busybox, applets, tc.links); err != nil {
			return err
		}
		return mountpoints(root, tc.binds)
	})
	if err != nil {
		return nil, err
	}
	poly.Env = []string{defaultPATH, "HOME=/root"}
	poly.Runtimes = append([]Runtime{{Name: "sh", Argv: []string{"/bin/sh", "-c"}}}, tc.runtimes...)
	cat[poly.Name] = poly

	if missing := desktopMissing(o.HostRoot); len(missing) == 0 {
		desk, err := buildDesktop(dir, o, applets, tc)
		if err != nil {
			return nil, err
		}
		cat[desk.Name] = desk
	}
	return cat, nil
}

// DesktopPrograms are the host programs tpl_desktop runs (from Debian's xvfb,
// matchbox-window-manager, chromium and x11-apps: scripts/deps.sh installs them). Without
// any of them the catalog has no tpl_desktop.
func DesktopPrograms() []string {
	return []string{"/usr/bin/Xvfb", "/usr/bin/xkbcomp", "/usr/bin/matchbox-window-manager", "/usr/lib/chromium/chromium", "/usr/bin/xwd"}
}

// desktopMissing lists the DesktopPrograms that hostRoot lacks.
func desktopMissing(hostRoot string) []string {
	var missing []string
	for _, p := range DesktopPrograms() {
		if fi, err := os.Stat(filepath.Join(hostRoot, p)); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, p)
		}
	}
	return missing
}

// DesktopData is the guest directory a desktop keeps its agent's memory under (DesktopData +
// "/memory"): in tpl_desktop it is a symlink to DesktopDataTarget, so it lives on the guest's
// writable disk with the workspace and the browser profile (under /root). The target does
// not exist until the guest makes it.
const (
	DesktopData       = "/data"
	DesktopDataTarget = hypervisor.GuestWorkspace + "/data"
)

// buildDesktop is tpl_dev_polyglot's tree (the host's /usr read-only, where Xvfb, the window
// manager, Chromium and the fonts live) plus the bits of /etc they read, and /data pointing at
// the writable disk.
func buildDesktop(dir string, o Options, applets []string, tc toolchains) (Template, error) {
	binds := slices.Clone(tc.binds)
	// Fontconfig's configuration and cache, and Chromium's policies and launcher flags.
	for _, p := range []string{"/etc/fonts", "/etc/chromium", "/etc/chromium.d", "/var/cache/fontconfig"} {
		if fi, err := os.Stat(filepath.Join(o.HostRoot, p)); err == nil && fi.IsDir() {
			binds = append(binds, hypervisor.Bind{Source: filepath.Join(o.HostRoot, p), Target: p})
		}
	}
	t, err := build(dir, Desktop, binds, func(root string) error {
		if err := writeBaseWithLinks(root, o.Busybox, applets, tc.links); err != nil {
			return err
		}
		if err := os.Symlink(DesktopDataTarget, filepath.Join(root, strings.TrimPrefix(DesktopData, "/"))); err != nil {
			return err
		}
		return mountpoints(root, binds)
	})
	if err != nil {
		return t, err
	}
	t.Env = []string{defaultPATH, "HOME=/root"}
	// Only sh: a template's runtimes are what one-shot runs use it for (session.Catalog
	// Runtime, the node's run pools), and a run wants the lightest guest with its runtime.
	// Listing the toolchains here sent every python3 run (tpl_desktop sorts first) to a guest
	// with the desktop's binds, and on one host halved the runs a second. Its sessions still
	// run the host's python3 and node through /usr.
	t.Runtimes = []Runtime{{Name: "sh", Argv: []string{"/bin/sh", "-c"}}}
	return t, nil
}

// build assembles one template through fill in a scratch dir, digests it, and moves it into
// its content-addressed place (or drops it when that place already holds the same digest).
func build(dir, name string, binds []hypervisor.Bind, fill func(root string) error) (Template, error) {
	t := Template{Name: name, Binds: binds}
	scratch, err := os.MkdirTemp(dir, "."+name+"-")
	if err != nil {
		return t, fmt.Errorf("templates: %w", err)
	}
	defer os.RemoveAll(scratch)
	root := filepath.Join(scratch, rootfsDirName)
	if err := os.Mkdir(root, 0o755); err != nil {
		return t, fmt.Errorf("templates: %w", err)
	}
	if err := fill(root); err != nil {
		return t, fmt.Errorf("templates: %s: %w", name, err)
	}
	sum, err := Digest(root, binds)
	if err != nil {
		return t, err
	}
	t.Digest = sum
	final := filepath.Join(dir, name+"-"+strings.TrimPrefix(sum, "sha256:")[:16])
	t.RootFS = filepath.Join(final, rootfsDirName)
	if have, err := Digest(t.RootFS, binds); err == nil && have == sum {
		return t, nil
	}
	if err := os.RemoveAll(final); err != nil {
		return t, fmt.Errorf("templates: %w", err)
	}
	if err := os.Rename(scratch, final); err != nil {
		return t, fmt.Errorf("templates: %w", err)
	}
	if err := os.Chmod(final, 0o755); err != nil {
		return t, fmt.Errorf("templates: %w", err)
	}
	return t, nil
}

func busyboxApplets(bin string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("templates: %s --list: %w", bin, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	if !slices.Contains(applets, "sh") {
		return nil, fmt.Errorf("templates: %s has no sh applet", bin)
	}
	sort.Strings(applets)
	return applets, nil
}

// writeBase lays out the busybox root: /bin/busybox and its applet links, /usr/bin/env, the
// guest's mount points, and a minimal /etc.
// writeBaseWithLinks is writeBase plus the host toolchains' symlinks (detectToolchains),
// recreated in the rootfs: what tpl_dev_polyglot and tpl_desktop both start from.
func writeBaseWithLinks(root, busybox string, applets []string, links []hypervisor.Bind) error {
	if err := writeBase(root, busybox, applets); err != nil {
		return err
	}
	for _, l := range links {
		p := filepath.Join(root, l.Target)
		_ = os.RemoveAll(p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(l.Source, p); err != nil {
			return err
		}
	}
	return nil
}

func writeBase(root, busybox string, applets []string) error {
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{
		{"bin", 0o755}, {"etc", 0o755}, {"usr", 0o755}, {"usr/bin", 0o755}, {"workspace", 0o755},
		{"tmp", fs.ModeSticky | 0o777}, {"root", 0o700}, {"proc", 0o555}, {"dev", 0o755}, {"sys", 0o555},
		{"run", 0o755}, {"run/wb", 0o755}, {"run/wb-bin", 0o755}, {"var", 0o755},
	} {
		p := filepath.Join(root, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	if err := copyFile(busybox, filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return err
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if err := os.Symlink("../../bin/busybox", filepath.Join(root, "usr", "bin", "env")); err != nil {
		return err
	}
	if err := os.Symlink("bin", filepath.Join(root, "sbin")); err != nil {
		return err
	}
	if err := os.Symlink("../tmp", filepath.Join(root, "var", "tmp")); err != nil {
		return err
	}
	// The agent binary's mount point: a file, since a file is bind-mounted onto it.
	if err := os.WriteFile(filepath.Join(root, "run", "wb-bin", "wb"), nil, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
		"etc/hosts":    "127.0.0.1\tlocalhost wb-guest\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"etc/hostname": "wb-guest\n",
		"etc/shells":   "/bin/sh\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// mountpoints creates an empty dir (or file) in root for every bind target that is missing.
func mountpoints(root string, binds []hypervisor.Bind) error {
	for _, b := range binds {
		p := filepath.Join(root, b.Target)
		if _, err := os.Lstat(p); err == nil {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
		fi, err := os.Stat(b.Source)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if fi.IsDir() {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
		} else if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

// Digest is "sha256:" + SHA-256 over a deterministic walk of the tree at root (each entry's
// path, type and permission bits, symlink target, and file contents; no times or owners) and
// the bind list (source and target of each, in order).
func Digest(root string, binds []hypervisor.Bind) (string, error) {
	if _, err := os.Lstat(root); err != nil {
		return "", fmt.Errorf("templates: digest: %w", err)
	}
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		m := fi.Mode()
		fmt.Fprintf(h, "%s\x00%s\x00%o\x00", filepath.ToSlash(rel), m.Type().String(), uint32(m.Perm()|m&(fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid)))
		switch {
		case m&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s", t)
		case m.IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			fh := sha256.New()
			_, err = io.Copy(fh, f)
			f.Close()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%x", fh.Sum(nil))
		}
		h.Write([]byte{'\n'})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("templates: digest: %w", err)
	}
	for _, b := range binds {
		fmt.Fprintf(h, "bind\x00%s\x00%s\n", b.Source, b.Target)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// toolchains is what detectToolchains found on the host.
type toolchains struct {
	binds    []hypervisor.Bind // read-only binds
	links    []hypervisor.Bind // symlinks to recreate in the rootfs (Source = link text, Target = path)
	runtimes []Runtime
}

// detectToolchains binds the host's /usr (where Debian keeps python3, node, gcc and, under
// /usr/local/go, the Go toolchain), the bits of /etc they resolve through, and /lib, /lib64
// (as the same symlinks into /usr on a merged-/usr host, else as binds), then lists the
// runtimes that actually run on the host.
func detectToolchains(hostRoot string) toolchains {
	var tc toolchains
	host := func(p string) string { return filepath.Join(hostRoot, p) }
	if fi, err := os.Stat(host("/usr")); err != nil || !fi.IsDir() {
		return tc
	}
	tc.binds = append(tc.binds, hypervisor.Bind{Source: host("/usr"), Target: "/usr"})
	for _, p := range []string{"/lib", "/lib32", "/lib64", "/libx32"} {
		fi, err := os.Lstat(host(p))
		switch {
		case err != nil:
		case fi.Mode()&fs.ModeSymlink != 0:
			if t, err := os.Readlink(host(p)); err == nil {
				tc.links = append(tc.links, hypervisor.Bind{Source: t, Target: p})
			}
		case fi.IsDir():
			tc.binds = append(tc.binds, hypervisor.Bind{Source: host(p), Target: p})
		}
	}
	for _, p := range []string{"/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d"} {
		if _, err := os.Stat(host(p)); err == nil {
			tc.binds = append(tc.binds, hypervisor.Bind{Source: host(p), Target: p})
		}
	}
	// Each runtime takes a program's source as its last argument (argv then the code). Each
	// probe prints the runtime's version, which a run may ask for ("python3.11").
	//
	// Go is not among them, though sessions have its toolchain: `go run` of a hello world
	// with the guest's empty build cache took over a minute in a gVisor guest here (the
	// standard library compiled first), where a run is meant to take milliseconds.
	for _, c := range []struct {
		name  string
		paths []string
		probe []string
		argv  func(bin string) []string
	}{
		{"python3", []string{"/usr/bin/python3"}, []string{"-c", "import platform; print(platform.python_version())"},
			func(bin string) []string { return []string{bin, "-c"} }},
		{"node", []string{"/usr/bin/node", "/usr/bin/nodejs"}, []string{"-p", "process.versions.node"},
			func(bin string) []string { return []string{bin, "-e"} }},
		// A C program: compiled into the guest's workspace (where programs may run) and run.
		{"gcc", []string{"/usr/bin/gcc"}, []string{"-dumpfullversion"},
			func(bin string) []string { return []string{"/bin/sh", "-c", fmt.Sprintf(compileAndRunC, bin), "gcc"} }},
	} {
		for _, p := range c.paths {
			if out, ok := runs(host(p), c.probe); ok {
				tc.runtimes = append(tc.runtimes, Runtime{Name: c.name, Argv: c.argv(p), Version: probedVersion(out)})
				break
			}
		}
	}
	return tc
}

// compileAndRunC is the gcc runtime's shell script (%s: gcc's path): $1 is the C source.
const compileAndRunC = `cd /workspace && printf '%%s' "$1" >.wb-run.c && %s -O1 -o .wb-run .wb-run.c -lm && exec ./.wb-run`

// probedVersion is the version a probe printed ("3.11.7"), or "" when it printed something
// else.
func probedVersion(out string) string {
	v := strings.TrimSpace(out)
	if v == "" || len(v) > 32 || strings.Trim(v, "0123456789.") != "" || v[0] == '.' {
		return ""
	}
	return v
}

// runs reports whether bin exists and exits 0 with args on the host within 10 s, and what it
// printed.
func runs(bin string, args []string) (string, bool) {
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return "", false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{defaultPATH, "HOME=/tmp"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err == nil
}
