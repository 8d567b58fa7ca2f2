package decide

import (
	"encoding/json"
	"math"
)

// EventFromMap reads a guest event as the nodes report it today (node.RuntimeChecker's map:
// "type" and the fields of its type, numbers as Go integers or JSON numbers). Fields it does not
// know, and fields of the wrong type, are left out: deciders see only the typed Event.
func EventFromMap(m map[string]any) Event {
	ev := Event{Type: EventType(str(m["type"]))}
	ev.Argv = strs(m["argv"])
	ev.PTY, _ = m["pty"].(bool)
	ev.PID = int(num(m["pid"]))
	ev.Host = str(m["host"])
	ev.Port = int(num(m["port"]))
	ev.Addresses = strs(m["addresses"])
	ev.CPUMs, ev.IntervalMs, ev.MemoryBytes = num(m["cpu_ms"]), num(m["interval_ms"]), num(m["memory_bytes"])
	return ev
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func strs(v any) []string {
	switch x := v.(type) {
	case []string:
		return x
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// num reads an integer; anything else (a fraction, a string, out of range) is 0.
func num(v any) int64 {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
	}
	return 0
}
