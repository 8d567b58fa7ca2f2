package chapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"wb/hypervisor/cloudhv/chspec"
)

// wbVmConfig is the configuration the driver sends (COMMON.md of issue 13).
var wbVmConfig = VmConfig{
	Payload: PayloadConfig{Kernel: "/t/vmlinuz", Cmdline: "console=hvc0 root=/dev/vda ro init=/run/wb-bin/wb WB_X=1 -- agent --vsock-port 1024"},
	Cpus:    &CpusConfig{BootVcpus: 1, MaxVcpus: 4},
	Memory:  &MemoryConfig{Size: 256 << 20, HotplugSize: 768 << 20},
	Disks: []DiskConfig{
		{ID: "rootfs", Path: "/t/rootfs.ext4", Readonly: true},
		{ID: "writable", Path: "/s/writable.ext4"},
	},
	Vsock:   &VsockConfig{Cid: 3, Socket: "/s/vsock.socket"},
	Net:     []NetConfig{{Tap: "wbtap0", Mac: "52:54:00:12:34:56"}},
	Serial:  &ConsoleConfig{Mode: "Off"},
	Console: &ConsoleConfig{Mode: "File", File: "/s/console.log"},
	Pvpanic: true,
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestClientContract: every method sends a request the document allows, to the right
// path with the right method and JSON names, and parses an answer the document allows.
func TestClientContract(t *testing.T) {
	infoBody, _ := json.Marshal(VmInfo{Config: wbVmConfig, State: VmStatePaused, MemoryActualSize: 256 << 20})
	vmm := newContractVMM(t, map[string]answer{
		"GET vmm.ping":     {200, `{"build_version":"v54.0-dirty","version":"v54.0","pid":4242,"features":["kvm","io_uring"]}`, false},
		"PUT vm.create":    {204, "", false},
		"PUT vm.boot":      {204, "", false},
		"PUT vm.pause":     {204, "", false},
		"PUT vm.resume":    {204, "", false},
		"PUT vm.snapshot":  {204, "", false},
		"PUT vm.restore":   {204, "", false},
		"PUT vm.shutdown":  {204, "", false},
		"PUT vm.delete":    {204, "", false},
		"GET vm.info":      {200, string(infoBody), false},
		"GET vm.counters":  {200, `{"_net0":{"rx_bytes":1500,"tx_bytes":9000,"rx_frames":3,"tx_frames":7},"_disk0":{"read_bytes":4096,"write_bytes":0}}`, false},
		"PUT vm.resize":    {204, "", false},
		"PUT vm.add-vsock": {200, `{"id":"_vsock0","bdf":"0000:00:06.0"}`, false},
		"PUT vm.add-net":   {200, `{"id":"_net1","bdf":"0000:00:07.0"}`, false},
		"PUT vmm.shutdown": {200, "", false}, // the real server's deviation
	})
	c := New(vmm.socket)
	ctx := ctxT(t)

	// wantSent checks the last request: method, op, and the JSON body (as a value, so key
	// order does not matter); "" means no body.
	wantSent := func(method, op, body string) {
		t.Helper()
		got := vmm.last()
		if got.method != method || got.path != op {
			t.Errorf("sent %s %s, want %s %s", got.method, got.path, method, op)
		}
		if !got.sized {
			t.Errorf("%s sent its body without a Content-Length", op)
		}
		if body == "" {
			if got.body != "" {
				t.Errorf("%s sent body %q, want none", op, got.body)
			}
			return
		}
		if got.contentType != "application/json" {
			t.Errorf("%s sent Content-Type %q, want application/json", op, got.contentType)
		}
		var g, w any
		if err := json.Unmarshal([]byte(got.body), &g); err != nil {
			t.Fatalf("%s sent %q: %v", op, got.body, err)
		}
		json.Unmarshal([]byte(body), &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s sent %s\nwant %s", op, got.body, body)
		}
	}

	ping, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (VmmPingResponse{BuildVersion: "v54.0-dirty", Version: "v54.0", Pid: 4242, Features: []string{"kvm", "io_uring"}}); !reflect.DeepEqual(ping, want) {
		t.Errorf("Ping = %+v, want %+v", ping, want)
	}
	wantSent("GET", "vmm.ping", "")

	if err := c.CreateVM(ctx, wbVmConfig); err != nil {
		t.Fatal(err)
	}
	wantSent("PUT", "vm.create", `{
		"payload":{"kernel":"/t/vmlinuz","cmdline":"console=hvc0 root=/dev/vda ro init=/run/wb-bin/wb WB_X=1 -- agent --vsock-port 1024"},
		"cpus":{"boot_vcpus":1,"max_vcpus":4},
		"memory":{"size":268435456,"hotplug_size":805306368},
		"disks":[{"id":"rootfs","path":"/t/rootfs.ext4","readonly":true},{"id":"writable","path":"/s/writable.ext4"}],
		"net":[{"tap":"wbtap0","mac":"52:54:00:12:34:56"}],
		"serial":{"mode":"Off"},"console":{"mode":"File","file":"/s/console.log"},
		"vsock":{"cid":3,"socket":"/s/vsock.socket"},
		"pvpanic":true}`)

	for _, tc := range []struct {
		op   string
		call func(context.Context) error
	}{
		{"vm.boot", c.BootVM}, {"vm.pause", c.PauseVM}, {"vm.resume", c.ResumeVM},
		{"vm.shutdown", c.ShutdownVM}, {"vm.delete", c.DeleteVM}, {"vmm.shutdown", c.ShutdownVMM},
	} {
		if err := tc.call(ctx); err != nil {
			t.Fatalf("%s: %v", tc.op, err)
		}
		wantSent("PUT", tc.op, "")
	}

	if err := c.SnapshotVM(ctx, VmSnapshotConfig{DestinationURL: "file:///s/snap"}); err != nil {
		t.Fatal(err)
	}
	wantSent("PUT", "vm.snapshot", `{"destination_url":"file:///s/snap"}`)

	if err := c.RestoreVM(ctx, RestoreConfig{SourceURL: "file:///s/snap", Resume: true}); err != nil {
		t.Fatal(err)
	}
	wantSent("PUT", "vm.restore", `{"source_url":"file:///s/snap","resume":true}`)

	info, err := c.VMInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != VmStatePaused || !reflect.DeepEqual(info.Config, wbVmConfig) || info.MemoryActualSize != 256<<20 {
		t.Errorf("VMInfo = %+v", info)
	}
	wantSent("GET", "vm.info", "")

	counters, err := c.VMCounters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counters["_net0"]["tx_bytes"] != 9000 || counters["_disk0"]["read_bytes"] != 4096 || len(counters) != 2 {
		t.Errorf("VMCounters = %v", counters)
	}
	wantSent("GET", "vm.counters", "")

	if err := c.ResizeVM(ctx, VmResize{DesiredVcpus: 2, DesiredRam: 512 << 20}); err != nil {
		t.Fatal(err)
	}
	wantSent("PUT", "vm.resize", `{"desired_vcpus":2,"desired_ram":536870912}`)
	if err := c.ResizeVM(ctx, VmResize{DesiredRam: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	wantSent("PUT", "vm.resize", `{"desired_ram":1073741824}`) // vCPUs left as they are

	dev, err := c.AddVsock(ctx, VsockConfig{Cid: 4, Socket: "/s/v2.sock"})
	if err != nil || dev != (PciDeviceInfo{ID: "_vsock0", BDF: "0000:00:06.0"}) {
		t.Errorf("AddVsock = %+v, %v", dev, err)
	}
	wantSent("PUT", "vm.add-vsock", `{"cid":4,"socket":"/s/v2.sock"}`)

	dev, err = c.AddNet(ctx, NetConfig{Tap: "wbtap1", Mac: "52:54:00:00:00:01", ID: "net1"})
	if err != nil || dev != (PciDeviceInfo{ID: "_net1", BDF: "0000:00:07.0"}) {
		t.Errorf("AddNet = %+v, %v", dev, err)
	}
	wantSent("PUT", "vm.add-net", `{"tap":"wbtap1","mac":"52:54:00:00:00:01","id":"net1"}`)
}

// TestClientDocumentShapes: the answers the document allows besides the ones above: a cold
// add (204, no device) and vmm.shutdown's documented 204.
func TestClientDocumentShapes(t *testing.T) {
	vmm := newContractVMM(t, map[string]answer{
		"PUT vm.add-net":   {204, "", false},
		"PUT vm.add-vsock": {204, "", false},
		"PUT vmm.shutdown": {204, "", false},
	})
	c := New(vmm.socket)
	ctx := ctxT(t)
	if dev, err := c.AddNet(ctx, NetConfig{Tap: "t"}); err != nil || dev != (PciDeviceInfo{}) {
		t.Errorf("AddNet cold = %+v, %v", dev, err)
	}
	if dev, err := c.AddVsock(ctx, VsockConfig{Cid: 3, Socket: "/v"}); err != nil || dev != (PciDeviceInfo{}) {
		t.Errorf("AddVsock cold = %+v, %v", dev, err)
	}
	if err := c.ShutdownVMM(ctx); err != nil {
		t.Errorf("ShutdownVMM with 204: %v", err)
	}
}

// TestClientErrorShapes: each error answer of the real server becomes an *APIError with
// its chain, and the helpers classify it.
func TestClientErrorShapes(t *testing.T) {
	wrongState := `["Error from API","The VM could not be paused","Error pausing VM","Invalid transition: InvalidStateTransition(Created, Paused)"]`
	vmm := newContractVMM(t, map[string]answer{
		"PUT vm.pause":     {500, wrongState, false},
		"PUT vm.boot":      {404, `["Error from API","The VM could not boot","VM is not created"]`, false},
		"PUT vm.create":    {400, `["Error from API","The VM could not be created","Invalid config"]`, false},
		"PUT vm.add-net":   {409, `["Error from API","The new device could not be added","Identifier net1 is not unique"]`, false},
		"PUT vm.resize":    {429, `["Too Many Requests"]`, false},
		"PUT vm.delete":    {400, "", false}, // the router's bare 400 (a wrong method)
		"PUT vm.resume":    {500, `{"error":"nope"}`, true},
		"GET vm.info":      {404, `["Error from API","The VM info is not available","VM is not created"]`, false},
		"PUT vmm.shutdown": {500, `["Error from API","shutdown failed"]`, false},
	})
	c := New(vmm.socket)
	ctx := ctxT(t)

	for _, tc := range []struct {
		name      string
		call      func() error
		op        string
		status    int
		chain     []string
		is        func(error) bool
		inMessage []string
	}{
		{"wrong state", func() error { return c.PauseVM(ctx) }, "vm.pause", 500,
			[]string{"Error from API", "The VM could not be paused", "Error pausing VM", "Invalid transition: InvalidStateTransition(Created, Paused)"},
			IsWrongState, []string{"vm.pause", "500", "InvalidStateTransition(Created, Paused)"}},
		{"not created", func() error { return c.BootVM(ctx) }, "vm.boot", 404,
			[]string{"Error from API", "The VM could not boot", "VM is not created"}, IsNotCreated, []string{"vm.boot", "VM is not created"}},
		{"info of no VM", func() error { _, err := c.VMInfo(ctx); return err }, "vm.info", 404,
			[]string{"Error from API", "The VM info is not available", "VM is not created"}, IsNotCreated, []string{"vm.info"}},
		{"bad config", func() error { return c.CreateVM(ctx, wbVmConfig) }, "vm.create", 400,
			[]string{"Error from API", "The VM could not be created", "Invalid config"}, IsBadConfig, []string{"vm.create", "Invalid config"}},
		{"duplicate", func() error { _, err := c.AddNet(ctx, NetConfig{ID: "net1", Tap: "t"}); return err }, "vm.add-net", 409,
			[]string{"Error from API", "The new device could not be added", "Identifier net1 is not unique"}, IsConflict, []string{"vm.add-net", "net1 is not unique"}},
		{"resize busy", func() error { return c.ResizeVM(ctx, VmResize{DesiredVcpus: 1}) }, "vm.resize", 429,
			[]string{"Too Many Requests"}, IsBusy, []string{"vm.resize", "429"}},
		{"bare 400", func() error { return c.DeleteVM(ctx) }, "vm.delete", 400, nil, IsBadConfig, []string{"vm.delete", "400 Bad Request"}},
		{"not a chain", func() error { return c.ResumeVM(ctx) }, "vm.resume", 500,
			[]string{`(not an error chain) {"error":"nope"}`}, IsWrongState, []string{"vm.resume", "nope"}},
		{"vmm.shutdown refused", func() error { return c.ShutdownVMM(ctx) }, "vmm.shutdown", 500,
			[]string{"Error from API", "shutdown failed"}, IsWrongState, []string{"vmm.shutdown", "shutdown failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var apiErr *APIError
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v (%T), want an *APIError", err, err)
			}
			if apiErr.Op != tc.op || apiErr.Status != tc.status || !reflect.DeepEqual(apiErr.Chain, tc.chain) {
				t.Errorf("APIError = %#v, want op %s, status %d, chain %q", apiErr, tc.op, tc.status, tc.chain)
			}
			if !tc.is(err) {
				t.Errorf("the helper does not recognise %v", err)
			}
			for _, s := range tc.inMessage {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q lacks %q", err, s)
				}
			}
			// Exactly one helper answers yes.
			n := 0
			for _, is := range []func(error) bool{IsWrongState, IsNotCreated, IsBadConfig, IsConflict, IsBusy} {
				if is(err) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d helpers recognise %v, want 1", n, err)
			}
		})
	}
	if IsWrongState(errors.New("x")) || IsNotCreated(nil) {
		t.Error("a helper recognises an error that is not an *APIError")
	}
}

// TestClientRejectsBadAnswers: answers outside the document are errors that say so, and
// none makes the client read without bound.
func TestClientRejectsBadAnswers(t *testing.T) {
	huge := `{"version":"` + strings.Repeat("x", MaxResponseBytes) + `"}`
	vmm := newContractVMM(t, map[string]answer{
		"GET vmm.ping":    {200, huge, true},
		"GET vm.info":     {200, `{"config":{"payload":{}},"state":7}`, true},
		"GET vm.counters": {204, "", true}, // no body where one is required
		"PUT vm.pause":    {302, "", true},
		"PUT vm.boot":     {500, `["` + strings.Repeat("é", 4000) + `"]`, false},
	})
	c := New(vmm.socket)
	ctx := ctxT(t)

	if _, err := c.Ping(ctx); err == nil || !strings.Contains(err.Error(), "more than 1048576 bytes") {
		t.Errorf("Ping of a %d-byte answer: %v", len(huge), err)
	}
	if _, err := c.VMInfo(ctx); err == nil || !strings.Contains(err.Error(), "vm.info") || !strings.Contains(err.Error(), "VmInfo") {
		t.Errorf("VMInfo with a numeric state: %v", err)
	}
	if _, err := c.VMCounters(ctx); err == nil || !strings.Contains(err.Error(), "204") {
		t.Errorf("VMCounters answered 204: %v", err)
	}
	if err := c.PauseVM(ctx); err == nil || !strings.Contains(err.Error(), "302") {
		t.Errorf("PauseVM answered 302: %v", err)
	}
	err := c.BootVM(ctx)
	if msg := err.Error(); len(msg) > maxErrorText+len("…") || !strings.HasSuffix(msg, "…") || !strings.Contains(msg, "vm.boot") {
		t.Errorf("an 8 KB chain gives a %d-byte message: %.100q…", len(msg), msg)
	}
}

// TestShutdownVMMWhenTheVMMExitsFirst: the VMM reads vmm.shutdown and exits without
// answering; that is success. A VMM that is not there at all is an error.
func TestShutdownVMMWhenTheVMMExitsFirst(t *testing.T) {
	checker, err := chspec.NewChecker()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err == nil {
			req.URL.Scheme, req.URL.Host = "http", "localhost"
			err = checker.CheckRequest(req)
		}
		conn.Close() // the VMM exits: no answer
		ln.Close()
		served <- err
	}()
	if err := New(path).ShutdownVMM(ctxT(t)); err != nil {
		t.Errorf("ShutdownVMM when the VMM exits without answering: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("the VMM side: %v", err)
	}

	// Now nobody listens: nothing was asked, so it is an error naming the socket.
	err = New(path).ShutdownVMM(ctxT(t))
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("ShutdownVMM with no VMM: %v, want an error naming %s", err, path)
	}
}

// TestClientUnreachable: a missing socket is an error naming it and saying what to check.
func TestClientUnreachable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nothing.sock")
	_, err := New(path).Ping(ctxT(t))
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "--api-socket") || !strings.Contains(err.Error(), "vmm.ping") {
		t.Errorf("Ping of a missing socket: %v", err)
	}
}

// TestClientHonoursContext: a VMM that never answers does not hold the caller past its
// context, and ShutdownVMM does not take a cancelled wait for the VMM exiting.
func TestClientHonoursContext(t *testing.T) {
	release := make(chan struct{})
	path := listenUnix(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	t.Cleanup(func() { close(release) })
	c := New(path)
	for name, call := range map[string]func(context.Context) error{
		"PauseVM": c.PauseVM, "ShutdownVMM": c.ShutdownVMM,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := call(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s with a VMM that never answers: %v, want the deadline", name, err)
		}
	}
}
