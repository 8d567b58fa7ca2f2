package chvtest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestStateMachine sends every operation from every state and checks CH's answer: the status
// and the error chain (vmm/src/lib.rs, vm.rs, api/http), and the state afterwards.
func TestStateMachine(t *testing.T) {
	type want struct {
		status int
		chain  []string // an error's chain, compared on its first len(chain) entries
		state  string   // vm.info's state afterwards ("" : no VM, 404)
	}
	notRunning := func(act string, state string) want {
		return want{500, []string{"Error from API", act, "VM is not running"}, state}
	}
	transition := func(act, wrap, from, to string) want {
		return want{500, []string{"Error from API", act, wrap}, from}
	}
	_ = transition
	ops := []string{"vmm.ping", "vmm.shutdown", "vm.create", "vm.boot", "vm.pause", "vm.resume", "vm.shutdown",
		"vm.delete", "vm.info", "vm.counters", "vm.resize", "vm.add-vsock", "vm.add-net", "vm.snapshot", "vm.restore"}
	table := map[string]map[string]want{
		"none": {
			"vmm.ping":     {200, nil, ""},
			"vmm.shutdown": {200, nil, "exited"},
			"vm.create":    {204, nil, "Created"},
			"vm.boot":      {404, []string{"Error from API", "The VM could not boot", "VM config is missing"}, ""},
			"vm.pause":     notRunning("The VM could not be paused", ""),
			"vm.resume":    notRunning("The VM could not resume", ""),
			"vm.shutdown":  notRunning("The VM could not shutdown", ""),
			"vm.delete":    {204, nil, ""},
			"vm.info":      {404, []string{"Error from API", "The VM info is not available", "VM is not created"}, ""},
			"vm.counters":  notRunning("The VM info is not available", ""),
			"vm.resize":    {404, []string{"Error from API", "The VM could not be resized", "VM is not created"}, ""},
			"vm.add-vsock": {404, []string{"Error from API", "The vsock device could not be added to the VM", "VM is not created"}, ""},
			"vm.add-net":   {404, []string{"Error from API", "The network device could not be added to the VM", "VM is not created"}, ""},
			"vm.snapshot":  notRunning("The VM could not be snapshotted", ""),
			"vm.restore":   {204, nil, "Paused"},
		},
		"Created": {
			"vmm.ping":     {200, nil, "Created"},
			"vmm.shutdown": {200, nil, "exited"},
			"vm.create":    {500, []string{"Error from API", "The VM could not be created", "VM is already created"}, "Created"},
			"vm.boot":      {204, nil, "Running"},
			"vm.pause":     notRunning("The VM could not be paused", "Created"),
			"vm.resume":    notRunning("The VM could not resume", "Created"),
			"vm.shutdown":  notRunning("The VM could not shutdown", "Created"),
			"vm.delete":    {204, nil, ""},
			"vm.info":      {200, nil, "Created"},
			"vm.counters":  notRunning("The VM info is not available", "Created"),
			"vm.resize":    {204, nil, "Created"},
			"vm.add-vsock": {500, []string{"Error from API", "The vsock device could not be added to the VM", "Too many virtio-vsock devices"}, "Created"},
			"vm.add-net":   {204, nil, "Created"},
			"vm.snapshot":  notRunning("The VM could not be snapshotted", "Created"),
			"vm.restore":   {500, []string{"Error from API", "The VM could not be restored", "VM is already created"}, "Created"},
		},
		"Running": {
			"vmm.ping":     {200, nil, "Running"},
			"vmm.shutdown": {200, nil, "exited"},
			"vm.create":    {500, []string{"Error from API", "The VM could not be created", "VM is already created"}, "Running"},
			"vm.boot":      {500, []string{"Error from API", "The VM could not boot", "VM is already created"}, "Running"},
			"vm.pause":     {204, nil, "Paused"},
			"vm.resume": {500, []string{"Error from API", "The VM could not resume", "Cannot resume VM", "Failed to resume migratable component",
				"Invalid transition: InvalidStateTransition(Running, Running)"}, "Running"},
			"vm.shutdown":  {204, nil, "Created"},
			"vm.delete":    {204, nil, ""},
			"vm.info":      {200, nil, "Running"},
			"vm.counters":  {200, nil, "Running"},
			"vm.resize":    {204, nil, "Running"},
			"vm.add-vsock": {500, []string{"Error from API", "The vsock device could not be added to the VM", "Too many virtio-vsock devices"}, "Running"},
			"vm.add-net":   {200, nil, "Running"},
			"vm.snapshot": {500, []string{"Error from API", "The VM could not be snapshotted", "Cannot snapshot VM", "Failed to snapshot migratable component",
				"Trying to snapshot while VM is running"}, "Running"},
			"vm.restore": {500, []string{"Error from API", "The VM could not be restored", "VM is already created"}, "Running"},
		},
		"Paused": {
			"vmm.ping":     {200, nil, "Paused"},
			"vmm.shutdown": {200, nil, "exited"},
			"vm.create":    {500, []string{"Error from API", "The VM could not be created", "VM is already created"}, "Paused"},
			"vm.boot":      {500, []string{"Error from API", "The VM could not boot", "VM is already created"}, "Paused"},
			"vm.pause": {500, []string{"Error from API", "The VM could not be paused", "Cannot pause VM", "Failed to pause migratable component",
				"Invalid transition: InvalidStateTransition(Paused, Paused)"}, "Paused"},
			"vm.resume":    {204, nil, "Running"},
			"vm.shutdown":  {204, nil, "Created"},
			"vm.delete":    {204, nil, ""},
			"vm.info":      {200, nil, "Paused"},
			"vm.counters":  {200, nil, "Paused"},
			"vm.resize":    {204, nil, "Paused"},
			"vm.add-vsock": {500, []string{"Error from API", "The vsock device could not be added to the VM", "Too many virtio-vsock devices"}, "Paused"},
			"vm.add-net":   {200, nil, "Paused"},
			"vm.snapshot":  {204, nil, "Paused"},
			"vm.restore":   {500, []string{"Error from API", "The VM could not be restored", "VM is already created"}, "Paused"},
		},
	}
	// After vm.shutdown the VM is dropped but its config kept: CH reports Created, and boots it again.
	table["Shutdown"] = table["Created"]

	// One snapshot to restore from, taken once.
	snapDir := reachableTempDir(t)
	{
		f := startFake(t)
		f.boot()
		f.must("PUT", "vm.pause", "", 204)
		f.must("PUT", "vm.snapshot", `{"destination_url":"file://`+snapDir+`"}`, 204)
		f.must("PUT", "vm.delete", "", 204)
	}

	for _, from := range []string{"none", "Created", "Running", "Paused", "Shutdown"} {
		for _, op := range ops {
			w := table[from][op]
			t.Run(from+"/"+op, func(t *testing.T) {
				f := startFake(t)
				switch from {
				case "Created":
					f.must("PUT", "vm.create", f.config(""), 204)
				case "Running":
					f.boot()
				case "Paused":
					f.boot()
					f.must("PUT", "vm.pause", "", 204)
				case "Shutdown":
					f.boot()
					f.must("PUT", "vm.shutdown", "", 204)
				}
				method, body := "PUT", ""
				switch op {
				case "vmm.ping", "vm.info", "vm.counters":
					method = "GET"
				case "vm.create":
					body = f.config("")
				case "vm.resize":
					body = `{"desired_vcpus":2,"desired_ram":268435456}`
				case "vm.add-vsock":
					body = `{"cid":4,"socket":"` + filepath.Join(f.dir, "v2.sock") + `"}`
				case "vm.add-net":
					body = `{"id":"net7","tap":"tapx"}`
				case "vm.snapshot":
					d := filepath.Join(f.dir, "snap")
					if err := os.Mkdir(d, 0o700); err != nil {
						t.Fatal(err)
					}
					body = `{"destination_url":"file://` + d + `"}`
				case "vm.restore":
					// The snapshot names the first fake's writable image: point it at ours.
					d := filepath.Join(f.dir, "restore")
					copySnapshot(t, snapDir, d, f.writable)
					body = `{"source_url":"file://` + d + `"}`
				}
				status, got := f.do(method, op, body)
				if status != w.status {
					t.Fatalf("%s %s from %s: %d %s, want %d", method, op, from, status, got, w.status)
				}
				if w.chain != nil {
					var chain []string
					if err := json.Unmarshal([]byte(got), &chain); err != nil {
						t.Fatalf("error body %q is not a JSON array of strings: %v", got, err)
					}
					if len(chain) < len(w.chain) || !slices.Equal(chain[:len(w.chain)], w.chain) {
						t.Fatalf("error chain %q, want it to start with %q", chain, w.chain)
					}
				}
				switch w.state {
				case "exited":
					select {
					case err := <-f.done:
						f.done <- err // for the cleanup
					case <-timeAfter():
						t.Fatal("vmm.shutdown answered, but the VMM did not exit")
					}
					return
				case "":
					f.must("GET", "vm.info", "", 404)
				default:
					info := f.must("GET", "vm.info", "", 200)
					if !strings.Contains(info, fmt.Sprintf(`"state":%q`, w.state)) {
						t.Fatalf("vm.info after %s from %s: %s, want state %s", op, from, info, w.state)
					}
				}
				if op == "vm.counters" && status == 200 {
					var c map[string]map[string]uint64
					if err := json.Unmarshal([]byte(got), &c); err != nil {
						t.Fatal(err)
					}
					if _, ok := c["rootfs"]["read_bytes"]; !ok || c["rootfs"]["read_bytes"] == 0 {
						t.Errorf("counters %s: want rootfs read_bytes > 0 (init was read from it)", got)
					}
					if _, ok := c["writable"]["write_bytes"]; !ok {
						t.Errorf("counters %s: want writable write_bytes", got)
					}
				}
				if op == "vm.add-net" && status == 200 && !strings.Contains(got, `"id":"net7"`) {
					t.Errorf("add-net on a booted VM: %s, want a PciDeviceInfo for net7", got)
				}
			})
		}
	}
}

// copySnapshot copies snapshot src to dst with config.json's writable disk replaced by
// writable, as a driver restores onto its own copy of the disk.
func copySnapshot(t *testing.T, src, dst, writable string) {
	t.Helper()
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config.json", "state.json", "memory-ranges"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "config.json" {
			var cfg map[string]any
			if err := json.Unmarshal(b, &cfg); err != nil {
				t.Fatal(err)
			}
			for _, d := range cfg["disks"].([]any) {
				if m := d.(map[string]any); m["id"] == "writable" {
					m["path"] = writable
				}
			}
			cfg["vsock"].(map[string]any)["socket"] = filepath.Join(filepath.Dir(writable), "vsock.sock")
			b, _ = json.Marshal(cfg)
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
