//go:build linux

package main

import (
	"flag"
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

// TestRunPoolFollowsPool: the run pools are on wherever the warm pools are (--run-pool
// defaults to --pool), and --run-pool sizes them apart.
func TestRunPoolFollowsPool(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 1},
		{[]string{"--pool", "0"}, 0},
		{[]string{"--pool", "3"}, 3},
		{[]string{"--run-pool", "0"}, 0},
		{[]string{"--pool", "0", "--run-pool", "2"}, 2},
	} {
		var f nodeFlags
		fs := flag.NewFlagSet("node", flag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if got := f.runPoolSize(); got != c.want {
			t.Errorf("%q: run pool %d, want %d", c.args, got, c.want)
		}
	}
}
