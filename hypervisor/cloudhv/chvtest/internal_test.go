package chvtest

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBadResponsesCounted: an answer the document does not allow (405 is listed there but
// CH never sends it) is counted as the fake's bug, and still sent.
func TestBadResponsesCounted(t *testing.T) {
	v, err := New(Options{APISocket: "/unused", StateDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("PUT", "http://localhost/api/v1/vm.pause", nil)
	w := httptest.NewRecorder()
	v.write(w, r, errorChain(http.StatusInternalServerError, "Error from API"))
	if v.BadResponses() != 0 {
		t.Fatalf("a good answer was counted as bad")
	}
	v.write(w, r, apiResponse{status: http.StatusMethodNotAllowed})
	if v.BadResponses() != 1 {
		t.Fatalf("BadResponses = %d after a 405, want 1", v.BadResponses())
	}
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("recorder status %d", w.Code)
	}
}

// TestParseCmdline: Linux's split of the command line into init's path, arguments and
// environment.
func TestParseCmdline(t *testing.T) {
	p := parseCmdline("console=hvc0 root=/dev/vda ro ip=10.0.0.2::10.0.0.1:255.255.255.252::eth0:off init=/run/wb-bin/wb quiet virtio_net.napi=1 WB_X=1 A=b=c single -- agent --vsock-port 1024")
	if p.Path != "/run/wb-bin/wb" {
		t.Errorf("path %q", p.Path)
	}
	if got, want := p.Env, []string{"HOME=/", "TERM=linux", "WB_X=1", "A=b=c"}; !equal(got, want) {
		t.Errorf("env %q, want %q", got, want)
	}
	if got, want := p.Args, []string{"single", "agent", "--vsock-port", "1024"}; !equal(got, want) {
		t.Errorf("args %q, want %q", got, want)
	}
	if p := parseCmdline("console=hvc0"); p.Path != "/sbin/init" || len(p.Args) != 0 {
		t.Errorf("no init=: %+v", p)
	}
}

// TestParseIPParam: Linux's ip= as the fake's kernel reads it; autoconfiguration (dhcp) and
// words after "--" are not an address.
func TestParseIPParam(t *testing.T) {
	p, ok := parseIPParam("console=hvc0 ip=10.0.0.2::10.0.0.1:255.255.255.252::eth0:off init=/x -- ip=1.2.3.4")
	if want := (ipParam{Client: "10.0.0.2", Gateway: "10.0.0.1", Netmask: "255.255.255.252", Device: "eth0"}); !ok || p != want {
		t.Errorf("ip=: %+v, %v; want %+v", p, ok, want)
	}
	for _, line := range []string{"ip=dhcp", "console=hvc0", "init=/x -- ip=1.2.3.4::1.2.3.1:255.0.0.0::eth0:off"} {
		if p, ok := parseIPParam(line); ok {
			t.Errorf("%q: %+v, want none", line, p)
		}
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCgroupOf(t *testing.T) {
	v1 := "12:cpu,cpuacct:/wb-cloudhv/g1\n4:memory:/wb-cloudhv/g1\n1:name=systemd:/\n0::/\n"
	for _, c := range []struct{ text, controller, want string }{
		{v1, "cpuacct", "/wb-cloudhv/g1"},
		{v1, "memory", "/wb-cloudhv/g1"},
		{v1, "", "/"},
		{"0::/wb-cloudhv/g2\n", "", "/wb-cloudhv/g2"},
	} {
		if got, ok := cgroupOf(c.text, c.controller); !ok || got != c.want {
			t.Errorf("cgroupOf(%q, %q) = %q, %v; want %q", c.text, c.controller, got, ok, c.want)
		}
	}
	if _, ok := cgroupOf("0::/x\n", "memory"); ok {
		t.Error("found a memory hierarchy in a v2-only file")
	}
}

// TestHotplugRAM: CH's ACPI memory hotplug as the fake applies it to its guest: growth in
// 128 MiB DIMMs within boot size + hotplug_size; a shrink, or a VM without hotplug_size,
// keeps the guest's memory.
func TestHotplugRAM(t *testing.T) {
	const mib = 1 << 20
	vm := &vmInstance{bootRAM: 256 * mib, ram: 256 * mib, ramTop: 1024 * mib}
	for _, c := range []struct {
		desired, want int64
		err           string
	}{
		{384 * mib, 384 * mib, ""},
		{256 * mib, 0, ""}, // a shrink: nothing
		{400 * mib, 0, "not a valid size"},
		{1152 * mib, 0, "Not enough space in the hotplug RAM region"},
		{1024 * mib, 1024 * mib, ""},
	} {
		got, aerr := vm.hotplugRAM(c.desired)
		if got != c.want || (aerr == nil) != (c.err == "") || aerr != nil && !strings.Contains(aerr.Error(), c.err) {
			t.Errorf("hotplugRAM(%d MiB) = %d, %v; want %d, %q", c.desired/mib, got, aerr, c.want, c.err)
		}
	}
	fixed := &vmInstance{bootRAM: 256 * mib, ram: 256 * mib, ramTop: 256 * mib}
	if got, aerr := fixed.hotplugRAM(512 * mib); got != 0 || aerr != nil {
		t.Errorf("without hotplug_size: %d, %v; want the memory kept and no error", got, aerr)
	}
}
