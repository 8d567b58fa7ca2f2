package chvtest

import "testing"

// TestPanicsOnOOM: only sysctl.vm.panic_on_oom=1 or 2 among the kernel's words makes a guest
// OOM a panic; 0, another key, or the word among init's arguments does not.
func TestPanicsOnOOM(t *testing.T) {
	for cmdline, want := range map[string]bool{
		"console=hvc0 sysctl.vm.panic_on_oom=1 init=/sbin/init -- agent": true,
		"console=hvc0 sysctl.vm.panic_on_oom=2 init=/sbin/init":          true,
		"console=hvc0 sysctl.vm.panic_on_oom=0 init=/sbin/init":          false,
		"console=hvc0 vm.panic_on_oom=1 init=/sbin/init":                 false,
		"console=hvc0 init=/sbin/init -- sysctl.vm.panic_on_oom=1":       false,
		"": false,
	} {
		if got := panicsOnOOM(cmdline); got != want {
			t.Errorf("panicsOnOOM(%q) = %v, want %v", cmdline, got, want)
		}
	}
}
