package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// vmModules are the modules a guest needs for Cloud Hypervisor's devices, which Debian's
// cloud kernel builds as modules: virtio over PCI, the disks, the console (hvc0), the network,
// vsock (the agent's transport), and memory resizing.
func vmModules() []string {
	return []string{"virtio_pci", "virtio_blk", "virtio_console", "virtio_net", "vmw_vsock_virtio_transport", "virtio_balloon", "virtio_mem"}
}

// initScript is the initramfs's /init: load the modules, bring up loopback and the static
// address of the command line's ip= (Linux's own IP autoconfiguration runs before virtio_net,
// a module here, is loaded), mount root= read-only, move /dev there and switch to init= with
// the arguments and environment the kernel gave it (the command line's words after "--" and
// its KEY=VALUE words).
const initScript = `#!/bin/busybox sh
# wb guest initramfs (wb image build): load the VM's drivers, then run init= from root=.
# Nothing is exported: init gets exactly the environment the kernel gave this script.
# (Every command goes through $bb: PATH is not set to anything of ours.)
bb=/bin/busybox
$bb mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev
$bb mount -t proc -o nosuid,nodev,noexec proc /proc
while read -r m; do
	$bb insmod "/lib/modules/$m.ko" || echo "wb initramfs: insmod $m failed" >&2
done < /modules
root=/dev/vda
init=/run/wb-bin/wb
ipconf=
for w in $($bb cat /proc/cmdline); do
	case "$w" in
	root=*) root="${w#root=}" ;;
	init=*) init="${w#init=}" ;;
	ip=*) ipconf="${w#ip=}" ;;
	--) break ;;
	esac
done
# ip=client:server:gateway:netmask:hostname:device:autoconf, a static address only.
netup() {
	case "$1" in ""|dhcp|bootp|rarp|any|on|off|none) return 0 ;; esac
	dev="${6:-eth0}"
	$bb ifconfig "$dev" "$1" netmask "${4:-255.255.255.0}" up || echo "wb initramfs: cannot configure $dev" >&2
	[ -z "$3" ] || $bb route add default gw "$3" dev "$dev" || echo "wb initramfs: no route via $3" >&2
}
$bb ifconfig lo 127.0.0.1 up
oldifs="$IFS"; IFS=:
netup $ipconf
IFS="$oldifs"
n=0
while [ ! -b "$root" ] && [ $n -lt 100 ]; do $bb usleep 50000; n=$((n+1)); done
if ! $bb mount -t ext4 -o ro "$root" /newroot; then
	echo "wb initramfs: cannot mount root $root; loaded modules:" >&2
	$bb cat /proc/modules >&2
	exec $bb sh
fi
$bb umount /proc
$bb mount --move /dev /newroot/dev
# busybox sh exports SHLVL, PWD and, when it had none, its default PATH: init gets none of them.
nopath=
[ "$PATH" = /sbin:/usr/sbin:/bin:/usr/bin ] && nopath="-u PATH"
exec $bb env -u SHLVL -u PWD $nopath $bb switch_root /newroot "$init" "$@"
`

// moduleIndex maps module names ("_" for "-") to their .ko files below dir.
func moduleIndex(dir string) (map[string]string, error) {
	idx := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() && strings.HasSuffix(p, ".ko") {
			idx[strings.ReplaceAll(strings.TrimSuffix(e.Name(), ".ko"), "-", "_")] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("image: modules: %w", err)
	}
	return idx, nil
}

// moduleDepends reads a module's dependencies from its .modinfo section ("depends=a,b").
func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("image: module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("image: module %s has no .modinfo section", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("image: module %s: %w", path, err)
	}
	for kv := range bytes.SplitSeq(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for d := range strings.SplitSeq(string(v), ",") {
				if d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}

// moduleLoadOrder is wanted and their dependencies, each after the ones it depends on.
func moduleLoadOrder(idx map[string]string, wanted []string) ([]string, error) {
	var order []string
	state := map[string]int{} // 1: visiting, 2: done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("image: modules depend on each other in a cycle through %s", name)
		case 2:
			return nil
		}
		path, ok := idx[name]
		if !ok {
			if from != "" {
				return fmt.Errorf("image: module %s (needed by %s) is not in the kernel package", name, from)
			}
			return fmt.Errorf("image: module %s is not in the kernel package (is it built in? then drop it)", name)
		}
		state[name] = 1
		deps, err := moduleDepends(path)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, name)
		return nil
	}
	for _, w := range wanted {
		if err := visit(w, ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// writeInitramfs writes a gzipped newc cpio archive to path: busybox, /init, the modules in
// load order (and /modules listing them), and the mount points /init uses. Times and owners
// are fixed, so the same inputs give the same bytes.
func writeInitramfs(path, busybox string, idx map[string]string, order []string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	bw := bufio.NewWriter(f)
	zw := gzip.NewWriter(bw)
	w := &cpioWriter{w: zw, ino: 1}
	for _, d := range []string{"bin", "dev", "proc", "newroot", "lib", "lib/modules"} {
		w.add(d, fs.ModeDir|0o755, nil)
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		f.Close()
		return fmt.Errorf("image: busybox: %w", err)
	}
	w.add("bin/busybox", 0o755, bb)
	w.add("init", 0o755, []byte(initScript))
	w.add("modules", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	for _, m := range order {
		b, err := os.ReadFile(idx[m])
		if err != nil {
			f.Close()
			return fmt.Errorf("image: module %s: %w", m, err)
		}
		w.add("lib/modules/"+m+".ko", 0o644, b)
	}
	w.trailer()
	err = w.err
	for _, step := range []func() error{zw.Close, bw.Flush, f.Close} {
		if e := step(); err == nil {
			err = e
		}
	}
	if err != nil {
		return fmt.Errorf("image: initramfs: %w", err)
	}
	return nil
}

// cpioWriter writes the "newc" format Linux unpacks an initramfs from
// (Documentation/driver-api/early-userspace/buffer-format.rst): a 110-byte ASCII header,
// the NUL-terminated name, the data, each padded to 4 bytes.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

func (c *cpioWriter) add(name string, mode fs.FileMode, data []byte) {
	m := uint32(mode.Perm())
	switch {
	case mode.IsDir():
		m |= 0o040000
	default:
		m |= 0o100000
	}
	nlink := 1
	if mode.IsDir() {
		nlink = 2
	}
	c.entry(name, m, uint32(nlink), data)
}

func (c *cpioWriter) trailer() { c.entry("TRAILER!!!", 0, 1, nil) }

func (c *cpioWriter) entry(name string, mode, nlink uint32, data []byte) {
	if c.err != nil {
		return
	}
	ino := c.ino
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	buf := append([]byte(hdr), name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	buf = append(buf, data...)
	buf = pad4(buf)
	_, c.err = c.w.Write(buf)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
