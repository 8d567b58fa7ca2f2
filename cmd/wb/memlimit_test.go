package main

import (
	"errors"
	"os"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	meminfo := "MemTotal:       16777216 kB\nMemFree:         1000 kB\n" // 16 GiB
	for _, tc := range []struct {
		name  string
		env   string
		files map[string]string
		want  int64
	}{
		{"GOMEMLIMIT set", "4GiB", map[string]string{"/proc/meminfo": meminfo}, 0},
		{"no cgroup limit", "", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": "max\n"}, 4 << 30},
		{"cgroup v2 limit", "", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": "2147483648\n"}, 3 << 29},
		{"cgroup v1 limit", "", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n"}, 3 << 28},
		{"cgroup above the machine", "", map[string]string{"/proc/meminfo": meminfo, "/sys/fs/cgroup/memory.max": "68719476736\n"}, 4 << 30},
		{"nothing readable", "", nil, 0},
	} {
		got := memoryLimit(func(k string) string {
			if k == "GOMEMLIMIT" {
				return tc.env
			}
			return ""
		}, func(f string) ([]byte, error) {
			if s, ok := tc.files[f]; ok {
				return []byte(s), nil
			}
			return nil, errors.Join(os.ErrNotExist, errors.New(f))
		})
		if got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
