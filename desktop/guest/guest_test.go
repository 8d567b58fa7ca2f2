package guest_test

import (
	"bytes"
	"image/png"
	"testing"
	"time"

	"wb/desktop/guest"
)

func TestDesktopExplore(t *testing.T) {
	e := newEnv(t, "runsc")
	ctx := ctxT(t, 5*time.Minute)
	g := e.boot(ctx)
	t0 := time.Now()
	if err := guest.Start(ctx, g.ex); err != nil {
		t.Fatal(err)
	}
	t.Logf("start took %s", time.Since(t0))
	b, err := guest.Screenshot(ctx, g.ex)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("png %d bytes %v", len(b), img.Bounds())
	v, err := guest.RunJS(ctx, g.ex, "1+1")
	t.Logf("1+1 → %s %v", v, err)
}
