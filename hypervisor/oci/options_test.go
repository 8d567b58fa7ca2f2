package oci

import (
	"strings"
	"testing"
)

// TestStateAndBundleRootsRequired: a driver has no default state or bundle root, which two
// drivers (two wb on one host) would share and reap each other's guests from.
func TestStateAndBundleRootsRequired(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []Options{
		{Runtime: RuntimeRunc, RuntimePath: "/bin/true"},
		{Runtime: RuntimeRunc, RuntimePath: "/bin/true", StateRoot: dir + "/state"},
		{Runtime: RuntimeRunc, RuntimePath: "/bin/true", BundleRoot: dir + "/bundles"},
	} {
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), "StateRoot and Options.BundleRoot are required") {
			t.Errorf("New(%+v): %v, want the roots required", o, err)
		}
	}
}
