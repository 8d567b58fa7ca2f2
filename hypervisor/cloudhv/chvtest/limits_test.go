package chvtest_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cgroupValue reads a limit of the guest's cgroup, on cgroup v2 (file v2) or v1
// (controller/file v1).
func (f *fake) cgroupValue(v2, v1 string) string {
	f.t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(f.stateDir, "chv-*"))
	if len(dirs) != 1 {
		f.t.Fatalf("guest dirs %q, want one", dirs)
	}
	id := filepath.Base(dirs[0])
	controller, file := filepath.Split(v1)
	for _, pattern := range []string{
		"/sys/fs/cgroup/wb-fakech-*/" + id + "/" + v2,                     // v2
		"/sys/fs/cgroup/" + controller + "wb-fakech-*/" + id + "/" + file, // v1
	} {
		m, _ := filepath.Glob(pattern)
		if len(m) == 1 {
			b, err := os.ReadFile(m[0])
			if err != nil {
				f.t.Fatal(err)
			}
			return strings.TrimSpace(string(b))
		}
	}
	f.t.Fatalf("no cgroup file %s / %s for guest %s", v2, v1, id)
	return ""
}

// TestLimits: cpus.boot_vcpus and memory.size are the guest's CPU quota and memory limit,
// and vm.resize changes both (memory within the hotplug range, see TestHotplugRAM).
func TestLimits(t *testing.T) {
	f := startFake(t)
	f.boot() // 1 vCPU of max 2, 256 MiB
	mem := func() string { return f.cgroupValue("memory.max", "memory/memory.limit_in_bytes") }
	quota := func() string {
		if s := f.cgroupValue("cpu.max", "cpu/cpu.cfs_quota_us"); s != "" {
			return strings.Fields(s)[0]
		}
		return ""
	}
	if got := mem(); got != "268435456" {
		t.Errorf("memory limit %s, want 268435456 (memory.size)", got)
	}
	if got := quota(); got != "100000" {
		t.Errorf("CPU quota %s, want 100000 (1 vCPU)", got)
	}
	f.must("PUT", "vm.resize", `{"desired_vcpus":2,"desired_ram":536870912}`, 204)
	// The VM has no hotplug_size: as CH, the guest keeps its memory (the config says 512 MiB).
	if got := mem(); got != "268435456" {
		t.Errorf("memory limit after resize without a hotplug range %s, want 268435456 kept", got)
	}
	if got := quota(); got != "200000" {
		t.Errorf("CPU quota after resize %s, want 200000 (2 vCPUs)", got)
	}
	info := f.must("GET", "vm.info", "", 200)
	if !strings.Contains(info, `"boot_vcpus":2`) || !strings.Contains(info, `"size":536870912`) {
		t.Errorf("vm.info after resize: %s", info)
	}
	// Beyond max_vcpus: refused, nothing changed.
	if code, body := f.do("PUT", "vm.resize", `{"desired_vcpus":3}`); code != 500 || !strings.Contains(body, "The VM could not be resized") {
		t.Errorf("resize beyond max_vcpus: %d %s", code, body)
	}
}
