package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	if _, err := findBusybox(""); err != nil {
		t.Skip(err)
	}
}

// inode is what debugfs says of one path in an ext4 image.
type inode struct {
	Type string // "regular", "directory", "symlink"
	Mode uint32 // permission bits (with sticky)
	UID  int
	Link string // a symlink's target
}

// debugfsStat reads path's inode in img without mounting it.
func debugfsStat(t *testing.T, img, path string) (inode, bool) {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "stat "+path, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs stat %s: %v\n%s", path, err, out)
	}
	s := string(out)
	if strings.Contains(s, "File not found") {
		return inode{}, false
	}
	var n inode
	if m := regexp.MustCompile(`Type: (\S+)\s+Mode:\s+(\d+)`).FindStringSubmatch(s); m != nil {
		n.Type = m[1]
		mode, _ := strconv.ParseUint(m[2], 8, 32)
		n.Mode = uint32(mode)
	} else {
		t.Fatalf("debugfs stat %s: no type in\n%s", path, s)
	}
	if m := regexp.MustCompile(`User:\s+(\d+)`).FindStringSubmatch(s); m != nil {
		n.UID, _ = strconv.Atoi(m[1])
	}
	if m := regexp.MustCompile(`Fast link dest: "([^"]*)"`).FindStringSubmatch(s); m != nil {
		n.Link = m[1]
	}
	return n, true
}

// debugfsCat is the content of path in img.
func debugfsCat(t *testing.T, img, path string) []byte {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "out")
	if out, err := exec.Command("debugfs", "-R", "dump "+path+" "+dst, img).CombinedOutput(); err != nil {
		t.Fatalf("debugfs dump %s: %v\n%s", path, err, out)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatalf("debugfs dump %s: %v", path, err)
	}
	return b
}

func sha256Hex(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// readCPIO lists a gzipped newc archive: name → data (directories with nil data).
func readCPIO(t *testing.T, path string) (map[string][]byte, []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	var order []string
	for off := 0; ; {
		if len(raw)-off < 110 || string(raw[off:off+6]) != "070701" {
			t.Fatalf("initramfs: no newc header at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(raw[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("initramfs header field %d: %v", i, err)
			}
			return int(v)
		}
		mode, size, nameLen := field(1), field(6), field(11)
		name := string(raw[off+110 : off+110+nameLen-1])
		off = (off + 110 + nameLen + 3) &^ 3
		data := raw[off : off+size]
		off = (off + size + 3) &^ 3
		if name == "TRAILER!!!" {
			return files, order
		}
		if mode&0o170000 == 0o040000 {
			data = nil
		}
		files[name] = data
		order = append(order, name)
	}
}

// fakeModule is a minimal ELF64 relocatable object with only a .modinfo section (name= and
// depends=), which is all moduleDepends reads.
func fakeModule(name string, depends ...string) []byte {
	modinfo := []byte("license=GPL\x00depends=" + strings.Join(depends, ",") + "\x00name=" + name + "\x00")
	shstrtab := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shentsize = 64, 64
	infoOff := ehsize
	strOff := infoOff + len(modinfo)
	shOff := (strOff + len(shstrtab) + 7) &^ 7
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0})
	b.Write(make([]byte, 8))
	for _, v := range []any{uint16(1), uint16(62), uint32(1), uint64(0), uint64(0), uint64(shOff), uint32(0),
		uint16(ehsize), uint16(0), uint16(0), uint16(shentsize), uint16(3), uint16(2)} {
		_ = binary.Write(&b, le, v)
	}
	b.Write(modinfo)
	b.Write(shstrtab)
	b.Write(make([]byte, shOff-b.Len()))
	section := func(name, typ uint32, off, size int) {
		for _, v := range []any{name, typ, uint64(0), uint64(0), uint64(off), uint64(size), uint32(0), uint32(0), uint64(1), uint64(0)} {
			_ = binary.Write(&b, le, v)
		}
	}
	section(0, 0, 0, 0)
	section(1, 1, infoOff, len(modinfo))  // .modinfo, PROGBITS
	section(10, 3, strOff, len(shstrtab)) // .shstrtab, STRTAB
	return b.Bytes()
}

// fakeKernelDeb builds a linux-image .deb with a fake bzImage and fake modules (name →
// dependencies; a "-" in a file name as Debian has some).
func fakeKernelDeb(t *testing.T, modules map[string][]string) string {
	t.Helper()
	dir := t.TempDir()
	const release = "6.1.0-99-cloud-amd64"
	pkg := filepath.Join(dir, "pkg")
	for _, d := range []string{"DEBIAN", "boot", "lib/modules/" + release + "/kernel/drivers/virtio"} {
		if err := os.MkdirAll(filepath.Join(pkg, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	control := fmt.Sprintf("Package: linux-image-%s\nVersion: 6.1.999-1\nArchitecture: amd64\nMaintainer: wb tests <wb@localhost>\nDescription: fake kernel for wb's tests\n", release)
	write := func(p string, b []byte) {
		if err := os.WriteFile(filepath.Join(pkg, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("DEBIAN/control", []byte(control))
	write("boot/vmlinuz-"+release, []byte("fake bzImage"))
	for name, deps := range modules {
		write("lib/modules/"+release+"/kernel/drivers/virtio/"+strings.ReplaceAll(name, "_", "-")+".ko", fakeModule(name, deps...))
	}
	deb := filepath.Join(dir, "linux-image.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-b", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -b: %v\n%s", err, out)
	}
	return deb
}
