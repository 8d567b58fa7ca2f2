package chvtest_test

import (
	"strings"
	"testing"
)

// TestCheckedBodies: every request body and every answer body is checked against the
// document (the cleanup fails on any bad answer), and a body the document does not allow
// answers 400 with the checker's message.
func TestCheckedBodies(t *testing.T) {
	f := startFake(t)
	if code, body := f.do("PUT", "vm.create", `{"payload":{"kernel":7}}`); code != 400 || !strings.HasPrefix(body, `["Bad Request","chspec:`) {
		t.Fatalf("a body of the wrong type: %d %s, want 400 and the checker's message", code, body)
	}
	f.must("GET", "vmm.ping", "", 200)
	f.boot()
	f.must("GET", "vm.info", "", 200)
	f.must("GET", "vm.counters", "", 200)
	f.must("PUT", "vm.add-net", `{"id":"net1","tap":"tap1"}`, 200)
	f.must("PUT", "vm.pause", "", 204)
	f.must("PUT", "vm.resume", "", 204)
}
