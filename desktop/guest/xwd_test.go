package guest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"image/color"
	"image/png"
	"os"
	"strings"
	"testing"
)

// fakeXWD writes a 32-bit TrueColor ZPixmap dump of pixels (0xRRGGBB) as xwd would.
func fakeXWD(t testing.TB, w, h int, msb bool, pixels []uint32) []byte {
	t.Helper()
	hd := xwdHeader{
		HeaderSize: xwdHeaderSize + 8, Version: 7, Format: 2, Depth: 24, Width: uint32(w), Height: uint32(h),
		BitmapUnit: 32, BitmapPad: 32, BitsPerPixel: 32, BytesPerLine: uint32(w * 4), VisualClass: 4,
		RedMask: 0xff0000, GreenMask: 0xff00, BlueMask: 0xff, BitsPerRGB: 8, NColors: 1,
	}
	if msb {
		hd.ByteOrder = 1
	}
	var b bytes.Buffer
	_ = binary.Write(&b, binary.BigEndian, hd)
	b.WriteString("xwdump\x00\x00")
	b.Write(make([]byte, 12)) // one colormap entry
	for _, p := range pixels {
		if msb {
			_ = binary.Write(&b, binary.BigEndian, p)
		} else {
			_ = binary.Write(&b, binary.LittleEndian, p)
		}
	}
	return b.Bytes()
}

func TestDecodeXWDColours(t *testing.T) {
	for _, msb := range []bool{false, true} {
		img, err := decodeXWD(fakeXWD(t, 2, 2, msb, []uint32{0xff0000, 0x00ff00, 0x0000ff, 0x123456}))
		if err != nil {
			t.Fatal(err)
		}
		want := []color.NRGBA{{255, 0, 0, 255}, {0, 255, 0, 255}, {0, 0, 255, 255}, {0x12, 0x34, 0x56, 255}}
		for i, c := range want {
			if got := img.NRGBAAt(i%2, i/2); got != c {
				t.Errorf("msb=%v pixel %d = %v, want %v", msb, i, got, c)
			}
		}
	}
}

// TestDecodeXWDRealCaptures decodes dumps that xwd -root wrote of Xvfb at depths 24 and 16.
func TestDecodeXWDRealCaptures(t *testing.T) {
	for name, size := range map[string][2]int{"testdata/xvfb-40x30x24.xwd": {40, 30}, "testdata/xvfb-24x16x16.xwd": {24, 16}} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		img, err := decodeXWD(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if img.Bounds().Dx() != size[0] || img.Bounds().Dy() != size[1] {
			t.Errorf("%s: %v", name, img.Bounds())
		}
		p, err := encodePNG(img)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(bytes.NewReader(p)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

func TestDecodeXWDRejects(t *testing.T) {
	good := fakeXWD(t, 2, 2, false, []uint32{1, 2, 3, 4})
	patch := func(field int, v uint32) []byte {
		b := bytes.Clone(good)
		binary.BigEndian.PutUint32(b[field*4:], v)
		return b
	}
	for name, c := range map[string]struct {
		in   []byte
		want string
	}{
		"short":           {good[:50], "shorter than the header"},
		"truncated":       {good[:len(good)-1], "announces"},
		"version":         {patch(1, 6), "file version"},
		"xy pixmap":       {patch(2, 1), "ZPixmap"},
		"zero width":      {patch(4, 0), "pixels"},
		"huge height":     {patch(5, 1<<20), "pixels"},
		"too many pixels": {patch(4, 8192), "pixels"}, // 8192 x 2 is fine, with height 8192…
		"bpp":             {patch(11, 8), "bits per pixel"},
		"line too short":  {patch(12, 4), "bytes per line"},
		"pseudocolor":     {patch(13, 3), "visual class"},
		"zero mask":       {patch(14, 0), "mask is zero"},
		"header size":     {patch(0, 1<<30), "header size"},
		"colormap":        {patch(19, 1<<20), "colormap"},
		"byte order":      {patch(7, 2), "byte order"},
	} {
		if name == "too many pixels" {
			c.in = patch(4, 8192)
			binary.BigEndian.PutUint32(c.in[5*4:], 8192)
		}
		if _, err := decodeXWD(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", name, err, c.want)
		}
	}
	if _, err := decodeXWD(make([]byte, maxXWDBytes+1)); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("oversized input: %v", err)
	}
}

// FuzzDecodeXWD: whatever the guest sends, decoding ends with an image within bounds or an
// error, never a panic or an allocation the header alone asked for.
func FuzzDecodeXWD(f *testing.F) {
	for _, name := range []string{"testdata/xvfb-40x30x24.xwd", "testdata/xvfb-24x16x16.xwd"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(fakeXWD(f, 2, 2, true, []uint32{1, 2, 3, 4}))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := decodeXWD(b)
		if err != nil {
			return
		}
		r := img.Bounds()
		if r.Dx() < 1 || r.Dy() < 1 || r.Dx()*r.Dy() > maxScreenPixels || r.Dx()*r.Dy()*4 > 2*len(b)+64 {
			t.Fatalf("%v from %d bytes", r, len(b))
		}
	})
}

// scriptedExecer answers its execs in turn with the results it holds, and counts them.
type scriptedExecer struct {
	results []execResult
	calls   int
}

type execResult struct {
	stdout, stderr []byte
	code           int
}

func (e *scriptedExecer) Exec(context.Context, []string, []byte) ([]byte, []byte, int, error) {
	r := e.results[min(e.calls, len(e.results)-1)]
	e.calls++
	return r.stdout, r.stderr, r.code, nil
}

// TestScreenshotRetriesAGoneWindow: a window that goes while xwd walks the windows fails it
// with BadWindow; Screenshot looks again. Other failures are answered at once.
func TestScreenshotRetriesAGoneWindow(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(fakeXWD(t, 2, 2, false, []uint32{1, 2, 3, 4}))
	_ = zw.Close()
	badWindow := execResult{stderr: []byte("X Error of failed request:  BadWindow (invalid Window parameter)"), code: 1}
	ok := execResult{stdout: gz.Bytes()}

	e := &scriptedExecer{results: []execResult{badWindow, ok}}
	if b, err := Screenshot(context.Background(), e); err != nil || len(b) == 0 || e.calls != 2 {
		t.Errorf("after one BadWindow: %d bytes, %v, %d execs; want a PNG after 2", len(b), err, e.calls)
	}
	e = &scriptedExecer{results: []execResult{badWindow}}
	if _, err := Screenshot(context.Background(), e); err == nil || !strings.Contains(err.Error(), "BadWindow") || e.calls != 3 {
		t.Errorf("BadWindow every time: %v after %d execs; want the error after 3", err, e.calls)
	}
	e = &scriptedExecer{results: []execResult{{stderr: []byte("xwd:  unable to open display ':0'"), code: 1}, ok}}
	if _, err := Screenshot(context.Background(), e); err == nil || !strings.Contains(err.Error(), "is the desktop started") || e.calls != 1 {
		t.Errorf("no display: %v after %d execs; want the error at once", err, e.calls)
	}
}

// TestScreenshotBoundedByTheDisplay: a screenshot is at most the desktop's display (Width ×
// Height, either way round): a hostile guest's dump of 2048 × 2048, a few KiB gzipped, is
// refused. The bound was 4096 × 4096 whatever the display, and each screenshot could make the
// gateway hold a 64 MiB dump and a 64 MiB image (with no bound on how many at once) for an
// answer of kilobytes.
func TestScreenshotBoundedByTheDisplay(t *testing.T) {
	shot := func(w, h int) ([]byte, error) {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write(fakeXWD(t, w, h, false, make([]uint32, w*h)))
		_ = zw.Close()
		return Screenshot(context.Background(), &scriptedExecer{results: []execResult{{stdout: gz.Bytes()}}})
	}
	for _, size := range [][2]int{{Width, Height}, {Height, Width}} {
		if b, err := shot(size[0], size[1]); err != nil || len(b) == 0 {
			t.Errorf("a screenshot of %dx%d: %d bytes, %v; want a PNG", size[0], size[1], len(b), err)
		}
	}
	for _, size := range [][2]int{{2048, 2048}, {Width + 1, Height}, {Width, Width + 1}} {
		// Refused for its size, by its bytes (read no further) or by its header.
		if _, err := shot(size[0], size[1]); err == nil || !strings.Contains(err.Error(), "pixels") && !strings.Contains(err.Error(), "a screen may take") {
			t.Errorf("a screenshot of %dx%d: %v; want it refused", size[0], size[1], err)
		}
	}
}
