package main

import (
	"fmt"
	"testing"

	"wb/desktop/guest"
)

// TestWarmPools: --desktop-pool sizes the desktop's pool apart from --pool (a warm desktop
// starts a browser), and follows --pool when it is -1.
func TestWarmPools(t *testing.T) {
	names := []string{"tpl_base", guest.Template}
	for _, c := range []struct {
		pool, desktop int
		want          string
	}{
		{1, -1, "tpl_base:1 tpl_desktop:1"},
		{1, 0, "tpl_base:1"},
		{0, 2, "tpl_desktop:2"},
		{0, -1, ""},
	} {
		got := ""
		for _, p := range warmPools(names, c.pool, c.desktop) {
			if got != "" {
				got += " "
			}
			got += fmt.Sprintf("%s:%d", p.Template, p.Size)
			if (p.Warm != nil) != (p.Template == guest.Template) {
				t.Errorf("%s: warm-up %v", p.Template, p.Warm != nil)
			}
		}
		if got != c.want {
			t.Errorf("--pool %d --desktop-pool %d: pools %q, want %q", c.pool, c.desktop, got, c.want)
		}
	}
}
