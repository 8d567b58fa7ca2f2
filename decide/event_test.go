package decide

import (
	"encoding/json"
	"testing"
)

// The maps the nodes build today (node/runtime.go, egress.go, timers.go) read into the same
// typed events, whether their numbers are Go integers or went through JSON.
func TestEventFromMap(t *testing.T) {
	for _, c := range []struct {
		m    map[string]any
		want Event
	}{
		{map[string]any{"type": "exec", "argv": []any{"/bin/sh", "-c", "ls"}, "pty": true},
			Event{Type: EventExec, Argv: []string{"/bin/sh", "-c", "ls"}, PTY: true}},
		{map[string]any{"type": "process_start", "pid": 42, "argv": []any{"xmrig", 7}},
			Event{Type: EventProcessStart, PID: 42, Argv: []string{"xmrig"}}},
		{map[string]any{"type": "egress", "host": "pypi.org", "port": 443},
			Event{Type: EventEgress, Host: "pypi.org", Port: 443}},
		{map[string]any{"type": "resource_sample", "cpu_ms": int64(1500), "interval_ms": int64(5000), "memory_bytes": int64(1 << 30)},
			Event{Type: EventResourceSample, CPUMs: 1500, IntervalMs: 5000, MemoryBytes: 1 << 30}},
		{map[string]any{"type": "egress", "host": 7, "port": 1.5}, Event{Type: EventEgress}},
		{map[string]any{"type": "gpu_sample", "watts": 300}, Event{Type: "gpu_sample"}},
	} {
		if got := EventFromMap(c.m); mustJSON(t, got) != mustJSON(t, c.want) {
			t.Errorf("%v: %+v, want %+v", c.m, got, c.want)
		}
		// The same event after a JSON round trip (float64 numbers).
		var m map[string]any
		if err := json.Unmarshal([]byte(mustJSON(t, c.m)), &m); err != nil {
			t.Fatal(err)
		}
		if got := EventFromMap(m); mustJSON(t, got) != mustJSON(t, c.want) {
			t.Errorf("%v through JSON: %+v, want %+v", c.m, got, c.want)
		}
	}
}
