package chspec

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

func exchange(method, path, reqBody string, status int, respBody string) (*http.Request, *http.Response) {
	r, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(reqBody))
	if reqBody != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	resp := &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(respBody))}
	if respBody != "" {
		resp.Header.Set("Content-Type", "application/json")
	}
	return r, resp
}

// wbVmConfig is the VmConfig the driver sends (COMMON.md): payload, cpus, memory, the two
// disks, vsock and a tap.
const wbVmConfig = `{"payload":{"kernel":"/k/vmlinuz","cmdline":"console=hvc0 root=/dev/vda ro init=/run/wb-bin/wb -- agent --vsock-port 1024"},` +
	`"cpus":{"boot_vcpus":1,"max_vcpus":4},"memory":{"size":268435456},` +
	`"disks":[{"id":"rootfs","path":"/t/rootfs.ext4","readonly":true},{"id":"writable","path":"/s/writable.ext4"}],` +
	`"vsock":{"cid":3,"socket":"/s/vsock.socket"},"net":[{"tap":"wbtap0","mac":"52:54:00:12:34:56"}]}`

// TestChecker: the document's own shapes pass, the listed deviations pass, and anything
// else is named.
func TestChecker(t *testing.T) {
	c, err := NewChecker()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                  string
		method, path, req     string
		status                int
		resp                  string
		wantReqOK, wantRespOK bool
	}{
		{"ping", "GET", "/api/v1/vmm.ping", "", 200, `{"version":"v54.0","pid":12,"features":[]}`, true, true},
		{"ping without version", "GET", "/api/v1/vmm.ping", "", 200, `{"pid":12}`, true, false},
		{"ping with a string pid", "GET", "/api/v1/vmm.ping", "", 200, `{"version":"v54.0","pid":"12"}`, true, false},
		{"create as wb sends it", "PUT", "/api/v1/vm.create", wbVmConfig, 204, "", true, true},
		{"create with a string memory size", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k"},"memory":{"size":"1G"}}`, 204, "", false, true},
		{"create with a vsock cid below 3", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k"},"vsock":{"cid":2,"socket":"/v"}}`, 204, "", false, true},
		{"create with cpus missing max_vcpus", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k"},"cpus":{"boot_vcpus":1}}`, 204, "", false, true},
		{"info of wb's config", "GET", "/api/v1/vm.info", "", 200, `{"config":` + wbVmConfig + `,"state":"Paused","memory_actual_size":268435456}`, true, true},
		{"info without state", "GET", "/api/v1/vm.info", "", 200, `{"config":{"payload":{"kernel":"/k"}}}`, true, false},
		{"info of no VM: 404", "GET", "/api/v1/vm.info", "", 404, `["VM is not created"]`, true, true},
		{"counters", "GET", "/api/v1/vm.counters", "", 200, `{"_net2":{"rx_bytes":1,"tx_bytes":2},"_disk0":{"read_bytes":4096}}`, true, true},
		{"counters with a string count", "GET", "/api/v1/vm.counters", "", 200, `{"_net2":{"rx_bytes":"1"}}`, true, false},
		{"counters that are not nested", "GET", "/api/v1/vm.counters", "", 200, `{"rx_bytes":1}`, true, false},
		{"resize", "PUT", "/api/v1/vm.resize", `{"desired_vcpus":2,"desired_ram":536870912}`, 204, "", true, true},
		{"resize to no vcpus", "PUT", "/api/v1/vm.resize", `{"desired_vcpus":0}`, 204, "", false, true},
		{"add-vsock", "PUT", "/api/v1/vm.add-vsock", `{"cid":3,"socket":"/v"}`, 200, `{"id":"_vsock0","bdf":"0000:00:05.0"}`, true, true},
		{"add-net answering a device without bdf", "PUT", "/api/v1/vm.add-net", `{"tap":"tap0"}`, 200, `{"id":"_net1"}`, true, false},
		{"snapshot", "PUT", "/api/v1/vm.snapshot", `{"destination_url":"file:///s"}`, 204, "", true, true},
		{"restore", "PUT", "/api/v1/vm.restore", `{"source_url":"file:///s","prefault":false,"resume":true}`, 204, "", true, true},
		{"restore without source_url", "PUT", "/api/v1/vm.restore", `{"resume":true}`, 204, "", false, true},
		{"restore with net_fds (a deviation: the server takes it)", "PUT", "/api/v1/vm.restore", `{"source_url":"file:///s","net_fds":[{"id":"net0","num_fds":1}]}`, 204, "", true, true},
		{"boot of no VM: 404 and a chain (deviation)", "PUT", "/api/v1/vm.boot", "", 404, `["Error booting VM","VM is not created"]`, true, true},
		{"create with a bad config: 400 and a chain (deviation)", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k"}}`, 400, `["Error creating VM","Invalid config"]`, true, true},
		{"add-net duplicate: 409 and a chain (deviation)", "PUT", "/api/v1/vm.add-net", `{"tap":"tap0","id":"net0"}`, 409, `["Error adding net","Identifier net0 is not unique"]`, true, true},
		{"resize while a vCPU removal is pending: 429", "PUT", "/api/v1/vm.resize", `{"desired_vcpus":1}`, 429, `["Too Many Requests"]`, true, true},
		{"429 to anything but resize", "PUT", "/api/v1/vm.pause", "", 429, `["Too Many Requests"]`, true, false},
		{"a 418 is no status the server sends", "PUT", "/api/v1/vm.boot", "", 418, "", true, false},
		{"vmm.shutdown answers 204 (the document)", "PUT", "/api/v1/vmm.shutdown", "", 204, "", true, true},
		{"create", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":"/k","cmdline":"console=hvc0"}}`, 204, "", true, true},
		{"create without payload", "PUT", "/api/v1/vm.create", `{"cpus":{"boot_vcpus":1,"max_vcpus":1}}`, 204, "", false, true},
		{"create with a wrong type", "PUT", "/api/v1/vm.create", `{"payload":{"kernel":7}}`, 204, "", false, true},
		{"pause in a wrong state: 500 and an error chain", "PUT", "/api/v1/vm.pause", "", 500, `["Error pausing VM","InvalidStateTransition(Created, Paused)"]`, true, true},
		{"an error body that is not a chain", "PUT", "/api/v1/vm.pause", "", 500, `{"error":"x"}`, true, false},
		{"405 is in the document but never sent", "PUT", "/api/v1/vm.pause", "", 405, "", true, false},
		{"vmm.shutdown answers 200", "PUT", "/api/v1/vmm.shutdown", "", 200, "", true, true},
		{"info with a wrong state name", "GET", "/api/v1/vm.info", "", 200, `{"config":{"payload":{"kernel":"/k"}},"state":"Sleeping"}`, true, false},
		{"info", "GET", "/api/v1/vm.info", "", 200, `{"config":{"payload":{"kernel":"/k"}},"state":"Running"}`, true, true},
		{"an unknown path", "PUT", "/api/v1/vm.frobnicate", "", 404, "", false, true},
		{"outside the base path", "GET", "/vmm.ping", "", 200, `{"version":"x"}`, false, false}, // no operation answers 200 there
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, resp := exchange(tc.method, tc.path, tc.req, tc.status, tc.resp)
			if err := c.CheckRequest(r); (err == nil) != tc.wantReqOK {
				t.Errorf("CheckRequest: %v, want ok=%v", err, tc.wantReqOK)
			}
			if err := c.CheckResponse(r, resp); (err == nil) != tc.wantRespOK {
				t.Errorf("CheckResponse: %v, want ok=%v", err, tc.wantRespOK)
			}
			// The bodies are restored for the caller.
			if b, _ := io.ReadAll(resp.Body); string(b) != tc.resp {
				t.Errorf("response body after the check: %q, want %q", b, tc.resp)
			}
		})
	}
}

// TestCheckerConcurrent: one Checker serves many goroutines (the fake VMM checks each
// request on its own goroutine); run with -race.
func TestCheckerConcurrent(t *testing.T) {
	c, err := NewChecker()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 4 {
				r, resp := exchange("PUT", "/api/v1/vm.create", wbVmConfig, 204, "")
				if err := c.CheckRequest(r); err != nil {
					errs <- err
				}
				r, resp = exchange("GET", "/api/v1/vm.info", "", 200, `{"config":`+wbVmConfig+`,"state":"Running"}`)
				if err := c.CheckResponse(r, resp); err != nil {
					errs <- err
				}
				bad, _ := exchange("PUT", "/api/v1/vm.resize", `{"desired_vcpus":"two"}`, 204, "")
				if err := c.CheckRequest(bad); err == nil {
					errs <- fmt.Errorf("goroutine %d, round %d: a string desired_vcpus passed", i, j)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
