package cloudhv_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// guestCgroupFile reads a file of the fake's runc guest cgroup, nested below the VMM's: v2
// name, or v1 controller/name.
func (e *env) guestCgroupFile(t *testing.T, id, v2, v1 string) string {
	t.Helper()
	cg := e.d.CgroupPath(id)
	for _, pattern := range []string{
		filepath.Join("/sys/fs/cgroup", cg, "*", "chv-*", v2),
		filepath.Join("/sys/fs/cgroup", filepath.Dir(v1), cg, "*", "chv-*", filepath.Base(v1)),
	} {
		if m, _ := filepath.Glob(pattern); len(m) == 1 {
			b, err := os.ReadFile(m[0])
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no guest cgroup file %s or %s below %s", v2, v1, cg)
	return ""
}

// TestResize: vm.resize through the driver changes the guest's CPU quota and memory limit
// (the fake applies them to its guest's cgroup); a shrink of memory, a step that is not a
// multiple of 128 MiB, memory beyond the hotplug range and more vCPUs than max_vcpus are
// refused, naming the field.
func TestResize(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs to grow a guest to 2 vCPUs")
	}
	e := newEnv(t)
	ctx := testCtx(t, 5*time.Minute)
	s := e.spec(newID()) // 1 vCPU, 256 MiB
	c := e.boot(t, ctx, s)

	quota := func() string {
		if v := e.guestCgroupFile(t, s.ID, "cpu.max", "cpu/cpu.cfs_quota_us"); v != "" {
			return strings.Fields(v)[0]
		}
		return ""
	}
	memLimit := func() string { return e.guestCgroupFile(t, s.ID, "memory.max", "memory/memory.limit_in_bytes") }
	if q, m := quota(), memLimit(); q != "100000" || m != strconv.Itoa(256<<20) {
		t.Fatalf("before: quota %s, memory %s; want 100000 and 256 MiB", q, m)
	}
	if err := e.d.Resize(ctx, s.ID, 2, 512); err != nil {
		t.Fatal(err)
	}
	if q, m := quota(), memLimit(); q != "200000" || m != strconv.Itoa(512<<20) {
		t.Errorf("after Resize(2, 512): quota %s, memory %s; want 200000 and 512 MiB", q, m)
	}
	if err := e.d.Resize(ctx, s.ID, 1, 0); err != nil {
		t.Fatal(err)
	}
	if q, m := quota(), memLimit(); q != "100000" || m != strconv.Itoa(512<<20) {
		t.Errorf("after Resize(1, 0): quota %s, memory %s; want 100000 and 512 MiB kept", q, m)
	}
	for _, bad := range []struct {
		vcpu, mem int
		want      string
	}{
		{0, 256, "memory_mib 256 is less"},
		{0, 600, "steps of 128 MiB"},
		{0, 2048, "more than the VM can grow to (1024 MiB)"},
		{runtime.NumCPU() + 1, 0, "max_vcpus"},
		{-1, 0, "must not be negative"},
	} {
		err := e.d.Resize(ctx, s.ID, bad.vcpu, bad.mem)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Resize(%d, %d) = %v; want an error with %q", bad.vcpu, bad.mem, err, bad.want)
		}
	}
	if q, m := quota(), memLimit(); q != "100000" || m != strconv.Itoa(512<<20) {
		t.Errorf("after refused resizes: quota %s, memory %s; want 100000 and 512 MiB", q, m)
	}
	if got := sh(t, ctx, c, "echo ok"); got != "ok\n" {
		t.Errorf("the guest after resizes: %q", got)
	}
}
