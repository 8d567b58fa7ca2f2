package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math/bits"
)

// Bounds on a screenshot the guest sends: the desktop's display (Start makes it Width ×
// Height, and xwd -root dumps just that), either way round. A hostile guest sends what it
// likes, in a few KiB gzipped: each screenshot makes the host hold the dump and its image,
// which at the 4096 × 4096 once allowed were 64 MiB each.
const (
	maxScreenSide   = max(Width, Height)
	maxScreenPixels = Width * Height
	maxXWDBytes     = maxScreenPixels*4 + 1<<20 // pixels at 32 bits, header, name and colormap
)

// xwdHeaderSize is the fixed part of an XWD (X11 version 7) header: 25 big-endian CARD32.
const xwdHeaderSize = 100

// xwdHeader holds the fields of an XWD header that decoding needs.
type xwdHeader struct {
	HeaderSize, Version, Format, Depth, Width, Height, XOffset, ByteOrder, BitmapUnit, BitOrder,
	BitmapPad, BitsPerPixel, BytesPerLine, VisualClass, RedMask, GreenMask, BlueMask, BitsPerRGB,
	ColormapEntries, NColors, WindowWidth, WindowHeight, WindowX, WindowY, BorderWidth uint32
}

// decodeXWD decodes a ZPixmap XWD dump of a TrueColor or DirectColor screen (what `xwd -root`
// writes for Xvfb at depth 16, 24 or 32) into an image. Every size in the header is checked
// against the data before anything is allocated.
func decodeXWD(b []byte) (*image.NRGBA, error) {
	if len(b) > maxXWDBytes {
		return nil, fmt.Errorf("xwd: %d bytes, more than the %d a screen may take", len(b), maxXWDBytes)
	}
	var h xwdHeader
	if len(b) < xwdHeaderSize {
		return nil, fmt.Errorf("xwd: %d bytes, shorter than the header", len(b))
	}
	if err := binary.Read(bytes.NewReader(b[:xwdHeaderSize]), binary.BigEndian, &h); err != nil {
		return nil, fmt.Errorf("xwd: header: %w", err)
	}
	switch {
	case h.Version != 7:
		return nil, fmt.Errorf("xwd: file version %d, want 7", h.Version)
	case h.Format != 2:
		return nil, fmt.Errorf("xwd: pixmap format %d, want 2 (ZPixmap)", h.Format)
	case h.VisualClass != 4 && h.VisualClass != 5:
		return nil, fmt.Errorf("xwd: visual class %d, want TrueColor (4) or DirectColor (5)", h.VisualClass)
	case h.Width == 0 || h.Height == 0 || h.Width > maxScreenSide || h.Height > maxScreenSide || uint64(h.Width)*uint64(h.Height) > maxScreenPixels:
		return nil, fmt.Errorf("xwd: %dx%d pixels, want 1–%d a side and at most %d in all", h.Width, h.Height, maxScreenSide, maxScreenPixels)
	case h.BitsPerPixel != 16 && h.BitsPerPixel != 24 && h.BitsPerPixel != 32:
		return nil, fmt.Errorf("xwd: %d bits per pixel, want 16, 24 or 32", h.BitsPerPixel)
	case h.ByteOrder > 1:
		return nil, fmt.Errorf("xwd: byte order %d, want 0 or 1", h.ByteOrder)
	case h.HeaderSize < xwdHeaderSize || h.HeaderSize > xwdHeaderSize+4096:
		return nil, fmt.Errorf("xwd: header size %d, want %d–%d", h.HeaderSize, xwdHeaderSize, xwdHeaderSize+4096)
	case h.NColors > 1<<16:
		return nil, fmt.Errorf("xwd: %d colormap entries, want at most 65536", h.NColors)
	case h.RedMask == 0 || h.GreenMask == 0 || h.BlueMask == 0:
		return nil, errors.New("xwd: a colour mask is zero")
	}
	bpp := uint64(h.BitsPerPixel / 8)
	if uint64(h.BytesPerLine) < uint64(h.Width)*bpp || uint64(h.BytesPerLine) > uint64(h.Width)*bpp+64 {
		return nil, fmt.Errorf("xwd: %d bytes per line for %d pixels of %d bytes", h.BytesPerLine, h.Width, bpp)
	}
	pixels := uint64(h.HeaderSize) + uint64(h.NColors)*12 // each XWDColor is 12 bytes
	need := pixels + uint64(h.BytesPerLine)*uint64(h.Height)
	if uint64(len(b)) < need {
		return nil, fmt.Errorf("xwd: %d bytes, the header announces %d", len(b), need)
	}
	mask := uint32(1)<<h.BitsPerPixel - 1
	if h.BitsPerPixel == 32 {
		mask = ^uint32(0)
	}
	if h.RedMask&^mask != 0 || h.GreenMask&^mask != 0 || h.BlueMask&^mask != 0 {
		return nil, errors.New("xwd: a colour mask has bits beyond the pixel")
	}
	red, green, blue := channelOf(h.RedMask), channelOf(h.GreenMask), channelOf(h.BlueMask)
	img := image.NewNRGBA(image.Rect(0, 0, int(h.Width), int(h.Height)))
	data := b[pixels:need]
	for y := 0; y < int(h.Height); y++ {
		row := data[y*int(h.BytesPerLine):]
		for x := 0; x < int(h.Width); x++ {
			p := row[x*int(bpp) : (x+1)*int(bpp)]
			var v uint32
			if h.ByteOrder == 1 { // MSBFirst
				for _, c := range p {
					v = v<<8 | uint32(c)
				}
			} else {
				for i := len(p) - 1; i >= 0; i-- {
					v = v<<8 | uint32(p[i])
				}
			}
			img.SetNRGBA(x, y, color.NRGBA{R: red.of(v), G: green.of(v), B: blue.of(v), A: 0xff})
		}
	}
	return img, nil
}

// channel turns one colour mask's bits of a pixel into 8 bits.
type channel struct {
	mask  uint32
	shift int
	width int
}

func channelOf(mask uint32) channel {
	shift := bits.TrailingZeros32(mask)
	return channel{mask: mask, shift: shift, width: bits.OnesCount32(mask >> shift)}
}

func (c channel) of(v uint32) uint8 {
	x := (v & c.mask) >> c.shift
	switch {
	case c.width >= 8:
		return uint8(x >> (c.width - 8))
	default: // scale up: a 5-bit 31 becomes 255
		return uint8(x * 255 / (1<<c.width - 1))
	}
}

// encodePNG is img as a PNG; speed matters more than size here (the console polls it).
func encodePNG(img image.Image) ([]byte, error) {
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	if err := enc.Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("screenshot: png: %w", err)
	}
	return buf.Bytes(), nil
}
