package chvtest_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDevices: devices without an id get CH's generated names (one counter for all, disks
// first), counters are keyed by them, and a vsock device hot-plugged into a running VM
// answers 200 with its PciDeviceInfo and then works.
func TestDevices(t *testing.T) {
	f := startFake(t)
	cfg := map[string]any{
		"payload": map[string]any{"kernel": shared.kernel, "cmdline": "init=/sbin/guestinit"},
		"disks": []any{
			map[string]any{"path": shared.rootImage, "readonly": true},
			map[string]any{"path": f.writable},
		},
		"net": []any{map[string]any{"tap": "tap0"}},
	}
	b, _ := json.Marshal(cfg)
	f.must("PUT", "vm.create", string(b), 204)
	f.must("PUT", "vm.boot", "", 204)
	var info struct {
		Config struct {
			Disks []struct{ ID string } `json:"disks"`
			Net   []struct{ ID string } `json:"net"`
			Cpus  struct {
				BootVcpus int `json:"boot_vcpus"`
			} `json:"cpus"`
			Memory struct {
				Size int64 `json:"size"`
			} `json:"memory"`
		} `json:"config"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(f.must("GET", "vm.info", "", 200)), &info); err != nil {
		t.Fatal(err)
	}
	if len(info.Config.Disks) != 2 || info.Config.Disks[0].ID != "_disk0" || info.Config.Disks[1].ID != "_disk1" || info.Config.Net[0].ID != "_net2" {
		t.Fatalf("generated ids: %+v", info.Config)
	}
	if info.Config.Cpus.BootVcpus != 1 || info.Config.Memory.Size != 512<<20 {
		t.Errorf("CH's defaults (1 vCPU, 512 MiB) not filled in: %+v", info.Config)
	}
	var counters map[string]map[string]uint64
	if err := json.Unmarshal([]byte(f.must("GET", "vm.counters", "", 200)), &counters); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"_disk0", "_disk1"} {
		if _, ok := counters[id]["write_bytes"]; !ok {
			t.Errorf("counters lack %s: %v", id, counters)
		}
	}
	if _, ok := counters["_net2"]["tx_bytes"]; !ok {
		t.Errorf("counters lack _net2 tx_bytes: %v", counters)
	}

	body := f.must("PUT", "vm.add-vsock", `{"cid":3,"socket":"`+f.vsock+`"}`, 200)
	var pci struct{ ID, BDF string }
	if err := json.Unmarshal([]byte(body), &pci); err != nil || pci.ID != "_vsock3" || pci.BDF == "" {
		t.Fatalf("add-vsock answered %s (%v), want a PciDeviceInfo for _vsock3", body, err)
	}
	c, r := f.agent()
	defer c.Close()
	if got := ask(t, c, r, "hot"); got != "hot" {
		t.Fatalf("through the hot-plugged vsock: %q", got)
	}
}

// TestBootFailures: a boot that cannot happen answers 500 in CH's shape and leaves nothing
// behind (the cleanup checks mounts, loop devices and containers).
func TestBootFailures(t *testing.T) {
	t.Run("root image without mount points", func(t *testing.T) {
		f := startFake(t)
		empty := filepath.Join(f.dir, "empty")
		os.Mkdir(empty, 0o755)
		img := filepath.Join(f.dir, "bare.img")
		if err := run("mkfs.ext4", "-q", "-d", empty, img, "8M"); err != nil {
			t.Fatal(err)
		}
		f.must("PUT", "vm.create", strings.Replace(f.config(""), shared.rootImage, img, 1), 204)
		code, body := f.do("PUT", "vm.boot", "")
		if code != 500 || !strings.HasPrefix(body, `["Error from API","The VM could not boot",`) || !strings.Contains(body, "has no directory /proc") {
			t.Fatalf("boot: %d %s", code, body)
		}
		checkNoLeaks(t, f.stateDir, img)
		if info := f.must("GET", "vm.info", "", 200); !strings.Contains(info, `"state":"Created"`) {
			t.Fatalf("after a failed boot: %s", info)
		}
	})
	t.Run("vsock socket path taken", func(t *testing.T) {
		f := startFake(t)
		if err := os.WriteFile(f.vsock, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		f.must("PUT", "vm.create", f.config(""), 204)
		if code, body := f.do("PUT", "vm.boot", ""); code != 500 || !strings.Contains(body, "vsock") {
			t.Fatalf("boot: %d %s", code, body)
		}
	})
	t.Run("missing kernel", func(t *testing.T) {
		f := startFake(t)
		f.must("PUT", "vm.create", strings.Replace(f.config(""), shared.kernel, "/nonexistent/vmlinux", 1), 204)
		if code, body := f.do("PUT", "vm.boot", ""); code != 500 || !strings.Contains(body, "kernel") {
			t.Fatalf("boot: %d %s", code, body)
		}
	})
}
