package chvtest

import (
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"time"
)

// eventTimestamp is Rust's Duration as serde writes it.
type eventTimestamp struct {
	Secs  int64 `json:"secs"`
	Nanos int64 `json:"nanos"`
}

// monitorEvent is one event-monitor record, fields in CH's order.
type monitorEvent struct {
	Timestamp  eventTimestamp    `json:"timestamp"`
	Source     string            `json:"source"`
	Event      string            `json:"event"`
	Properties map[string]string `json:"properties"`
}

// eventMonitor writes events as CH's event-monitor thread does: each one pretty-printed
// (serde_json::to_string_pretty), followed by "\n\n", timestamps measured from the VMM's start.
// Writes happen on their own goroutine so that a reader that stalls never blocks the API (CH
// writes the file non-blocking and drops what does not fit).
type eventMonitor struct {
	start time.Time
	log   *slog.Logger
	mu    sync.Mutex
	cond  *sync.Cond
	queue [][]byte
	done  bool
	idle  chan struct{} // closed when the writer has drained the queue after close
}

func newEventMonitor(w io.Writer, log *slog.Logger) *eventMonitor {
	m := &eventMonitor{start: time.Now(), log: log, idle: make(chan struct{})}
	m.cond = sync.NewCond(&m.mu)
	if w == nil {
		close(m.idle)
		m.done = true
		return m
	}
	go m.write(w)
	return m
}

func (m *eventMonitor) emit(source, event string, props map[string]string) {
	m.log.Info("event", "source", source, "event", event, "properties", props)
	d := time.Since(m.start)
	b, err := json.MarshalIndent(monitorEvent{
		Timestamp: eventTimestamp{Secs: int64(d / time.Second), Nanos: int64(d % time.Second)},
		Source:    source, Event: event, Properties: props,
	}, "", "  ")
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return
	}
	m.queue = append(m.queue, append(b, '\n', '\n'))
	m.cond.Signal()
}

func (m *eventMonitor) write(w io.Writer) {
	defer close(m.idle)
	for {
		m.mu.Lock()
		for len(m.queue) == 0 && !m.done {
			m.cond.Wait()
		}
		q := m.queue
		m.queue = nil
		done := m.done
		m.mu.Unlock()
		for _, b := range q {
			if _, err := w.Write(b); err != nil {
				m.log.Warn("event monitor: write failed; event dropped", "err", err)
			}
		}
		if done && len(q) == 0 {
			return
		}
	}
}

// close flushes what is queued (waiting at most flushWait) and stops the writer.
func (m *eventMonitor) close(flushWait time.Duration) {
	m.mu.Lock()
	m.done = true
	m.cond.Signal()
	m.mu.Unlock()
	select {
	case <-m.idle:
	case <-time.After(flushWait):
	}
}
