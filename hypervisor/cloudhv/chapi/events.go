package chapi

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// MaxEventBytes bounds one event object. CH's largest events are a few hundred bytes; an
// object this size is not an event, and the decoder never holds more than this.
const MaxEventBytes = 64 << 10

// Event is one event of CH's event monitor (event_monitor/src/lib.rs).
type Event struct {
	// Timestamp is the time since the VMM set up its monitor, i.e. since it started.
	Timestamp time.Duration
	// Source is who emitted it: SourceVMM, SourceVM, SourceGuest, SourceVirtioDevice, …
	Source string
	// Event is what happened, e.g. EventBooted.
	Event string
	// Properties are the event's details (e.g. "id" of a device); nil when CH sent null.
	Properties map[string]string
}

// Sources and events CH emits (the event!( calls of its source at v54.0-dev).
const (
	SourceVMM          = "vmm"           // starting, shutdown
	SourceVM           = "vm"            // the VM's lifecycle
	SourceGuest        = "guest"         // panic, from the pvpanic device
	SourceVirtioDevice = "virtio-device" // activated, reset; property "id"
	SourceVdpa         = "vdpa"          // activated, reset; property "id"

	EventStarting      = "starting" // vmm
	EventShutdown      = "shutdown" // vm (the VM stopped) and vmm (the process exits)
	EventBooting       = "booting"
	EventBooted        = "booted"
	EventPausing       = "pausing"
	EventPaused        = "paused"
	EventResuming      = "resuming"
	EventResumed       = "resumed"
	EventSnapshotting  = "snapshotting"
	EventSnapshotted   = "snapshotted"
	EventRestoring     = "restoring"
	EventRestored      = "restored"
	EventRebooting     = "rebooting"
	EventRebooted      = "rebooted"
	EventResizing      = "resizing"
	EventResized       = "resized"
	EventDeleted       = "deleted"
	EventDeviceRemoved = "device-removed" // vm; properties "id", "bdf"
	EventActivated     = "activated"
	EventReset         = "reset"
	// EventPanic is the guest's kernel panicking (source guest; property "event" is
	// "panic" or "crash_loaded"). It needs VmConfig.Pvpanic.
	EventPanic = "panic"
)

// EventError is a part of the stream that is not an event. The decoder has skipped past
// it; the next call to Next reads the event after it.
type EventError struct {
	Offset int64  // where the bad part starts, in bytes from the stream's start
	Reason string // what is wrong
}

func (e *EventError) Error() string {
	return fmt.Sprintf("chapi: event monitor, byte %d: %s", e.Offset, e.Reason)
}

// EventDecoder reads CH's event-monitor stream: JSON objects, pretty-printed by
// serde_json, written back to back (CH adds a blank line after each; nothing here relies
// on it). It is not safe for concurrent use.
//
// CH writes to a non-blocking pipe and ignores a failed write, so when the reader falls
// behind an event can be cut short and the next one follows at once. The decoder reports
// the cut event as an *EventError and goes on with the next: a top-level event always
// starts with '{' at the start of a line, which is where pretty-printed nested objects
// never are and where a string cannot span to.
type EventDecoder struct {
	r   *bufio.Reader
	off int64  // bytes consumed from r
	buf []byte // the object being read
	err error  // sticky: the reader failed or the stream ended
	// skipping: after garbage, input is dropped up to the next "\n{".
	skipping bool
	prev     byte // the last byte consumed
}

// NewEventDecoder decodes the stream r (the read end of --event-monitor fd=).
func NewEventDecoder(r io.Reader) *EventDecoder {
	return &EventDecoder{r: bufio.NewReaderSize(r, 4096), prev: '\n'}
}

// Next returns the next event. It returns io.EOF at the end of the stream, an error
// wrapping io.ErrUnexpectedEOF when the stream ends inside an event, an *EventError for a
// part that is not an event (calling Next again continues after it), and the reader's
// error if reading fails.
func (d *EventDecoder) Next() (Event, error) {
	if d.err != nil {
		return Event{}, d.err
	}
	start, err := d.findStart()
	if err != nil {
		return Event{}, err
	}
	if err := d.readObject(start); err != nil {
		return Event{}, err
	}
	ev, reason := parseEvent(d.buf)
	if reason != "" {
		return Event{}, &EventError{Offset: start, Reason: reason}
	}
	return ev, nil
}

func (d *EventDecoder) readByte() (byte, error) {
	c, err := d.r.ReadByte()
	if err != nil {
		return 0, err
	}
	d.off++
	d.prev = c
	return c, nil
}

// unreadByte gives back the '{' that starts the next object.
func (d *EventDecoder) unreadByte() {
	d.r.UnreadByte() // cannot fail right after ReadByte
	d.off--
	d.prev = '\n'
}

// fail records a read error (sticky) and returns it.
func (d *EventDecoder) fail(err error, inEvent bool, start int64) error {
	switch {
	case errors.Is(err, io.EOF) && inEvent:
		d.err = fmt.Errorf("chapi: event monitor, byte %d: the stream ended inside an event (the VMM died mid-write?): %w", start, io.ErrUnexpectedEOF)
	case errors.Is(err, io.EOF):
		d.err = io.EOF
	default:
		d.err = fmt.Errorf("chapi: event monitor: read: %w", err)
	}
	return d.err
}

// findStart consumes input up to and including the '{' of the next event and returns its
// offset.
func (d *EventDecoder) findStart() (int64, error) {
	for {
		prev := d.prev
		c, err := d.readByte()
		if err != nil {
			return 0, d.fail(err, false, 0)
		}
		if d.skipping {
			if c == '{' && prev == '\n' {
				d.skipping = false
				return d.off - 1, nil
			}
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return d.off - 1, nil
		}
		d.skipping = true
		return 0, &EventError{Offset: d.off - 1, Reason: fmt.Sprintf(
			"%q where an event should start (a JSON object); is the fd cloud-hypervisor's --event-monitor? Skipping to the next event", c)}
	}
}

// readObject reads the object whose '{' was consumed at offset start into d.buf.
func (d *EventDecoder) readObject(start int64) error {
	d.buf = append(d.buf[:0], '{')
	depth, inString, escaped := 1, false, false
	for depth > 0 {
		prev := d.prev
		c, err := d.readByte()
		if err != nil {
			return d.fail(err, true, start)
		}
		if len(d.buf) >= MaxEventBytes {
			d.skipping = true
			return &EventError{Offset: start, Reason: fmt.Sprintf(
				"an event longer than %d bytes; CH's events are far smaller, so this is not one. Skipping to the next event", MaxEventBytes)}
		}
		d.buf = append(d.buf, c)
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
		case inString && c == '\n':
			// JSON strings hold no raw newline: the event was cut mid-string.
			d.skipping = true
			return &EventError{Offset: start, Reason: "an event cut short inside a string (CH drops the rest of an event when the pipe is full); continuing with the next"}
		case inString:
		case c == '"':
			inString = true
		case c == '{' && prev == '\n':
			d.unreadByte()
			return &EventError{Offset: start, Reason: "an event cut short: another began before it ended (CH drops the rest of an event when the pipe is full); continuing with the next"}
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}

// parseEvent decodes one complete object; reason is "" when it is an event.
func parseEvent(obj []byte) (Event, string) {
	var raw struct {
		Timestamp *struct {
			Secs  *uint64 `json:"secs"`
			Nanos *uint32 `json:"nanos"`
		} `json:"timestamp"`
		Source     string            `json:"source"`
		Event      string            `json:"event"`
		Properties map[string]string `json:"properties"`
	}
	if err := json.Unmarshal(obj, &raw); err != nil {
		return Event{}, fmt.Sprintf("not an event object: %v: %q", err, clip(obj, 120))
	}
	switch {
	case raw.Timestamp == nil || raw.Timestamp.Secs == nil || raw.Timestamp.Nanos == nil:
		return Event{}, fmt.Sprintf("an event without timestamp {secs, nanos}: %q", clip(obj, 120))
	case *raw.Timestamp.Nanos >= 1e9:
		return Event{}, fmt.Sprintf("timestamp.nanos %d is not below 1e9", *raw.Timestamp.Nanos)
	case *raw.Timestamp.Secs > math.MaxInt64/uint64(time.Second)-1:
		return Event{}, fmt.Sprintf("timestamp.secs %d is beyond any VMM's lifetime", *raw.Timestamp.Secs)
	case raw.Source == "" || raw.Event == "":
		return Event{}, fmt.Sprintf("an event without source or event: %q", clip(obj, 120))
	}
	return Event{
		Timestamp:  time.Duration(*raw.Timestamp.Secs)*time.Second + time.Duration(*raw.Timestamp.Nanos),
		Source:     raw.Source,
		Event:      raw.Event,
		Properties: raw.Properties,
	}, ""
}
