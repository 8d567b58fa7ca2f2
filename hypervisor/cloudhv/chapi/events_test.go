package chapi

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// pretty renders ev as CH does: serde_json::to_string_pretty of event_monitor's Event.
func pretty(ev Event) string {
	props := "null"
	if ev.Properties != nil {
		var b strings.Builder
		b.WriteString("{")
		i := 0
		for k, v := range ev.Properties {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "\n    %q: %q", k, v)
			i++
		}
		b.WriteString("\n  }")
		props = b.String()
	}
	return fmt.Sprintf("{\n  \"timestamp\": {\n    \"secs\": %d,\n    \"nanos\": %d\n  },\n  \"source\": %q,\n  \"event\": %q,\n  \"properties\": %s\n}",
		ev.Timestamp/time.Second, ev.Timestamp%time.Second, ev.Source, ev.Event, props)
}

// decodeAll reads r to its end: the events, and the errors (as text) in between.
func decodeAll(t testing.TB, r io.Reader) (events []Event, errs []string, end error) {
	d := NewEventDecoder(r)
	for range 1 << 20 {
		ev, err := d.Next()
		var evErr *EventError
		switch {
		case err == nil:
			events = append(events, ev)
		case errors.As(err, &evErr):
			errs = append(errs, err.Error())
		default:
			return events, errs, err
		}
	}
	t.Fatal("the decoder does not reach the end of a finite stream")
	return
}

func at(secs, nanos int64) time.Duration {
	return time.Duration(secs)*time.Second + time.Duration(nanos)
}

// TestEventDecoderLifecycle: a whole session's stream as CH writes it (pretty objects,
// each followed by a blank line) decodes to its events, in order, timestamps exact.
func TestEventDecoderLifecycle(t *testing.T) {
	f, err := os.Open("testdata/lifecycle.events")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, errs, end := decodeAll(t, f)
	if end != io.EOF || len(errs) > 0 {
		t.Fatalf("end %v, errors %q", end, errs)
	}
	var got []string
	for _, ev := range events {
		got = append(got, ev.Source+"/"+ev.Event)
	}
	want := []string{"vmm/starting", "vm/booting", "vm/booted",
		"virtio-device/activated", "virtio-device/activated", "virtio-device/activated", "virtio-device/activated",
		"vm/pausing", "vm/paused", "vm/snapshotting", "vm/snapshotted", "vm/resuming", "vm/resumed",
		"vm/resizing", "vm/resized", "guest/panic", "vm/shutdown", "vm/deleted", "vmm/shutdown"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events %q\nwant %q", got, want)
	}
	if ev := events[0]; ev.Timestamp != at(0, 1834211) || ev.Properties != nil {
		t.Errorf("first event %+v", ev)
	}
	if ev := events[6]; ev.Timestamp != at(0, 415021844) || !reflect.DeepEqual(ev.Properties, map[string]string{"id": "_net0"}) {
		t.Errorf("_net0 activated: %+v", ev)
	}
	if ev := events[15]; ev.Source != SourceGuest || ev.Event != EventPanic || ev.Properties["event"] != "panic" || ev.Timestamp != at(41, 2003114) {
		t.Errorf("guest panic: %+v", ev)
	}
}

// TestEventDecoderConcatenated: objects back to back with no separator at all, compact or
// pretty, and with other whitespace between them.
func TestEventDecoderConcatenated(t *testing.T) {
	a := Event{Timestamp: at(1, 2), Source: SourceVM, Event: EventBooted}
	b := Event{Timestamp: at(3, 999999999), Source: SourceVirtioDevice, Event: EventReset, Properties: map[string]string{"id": "_disk0"}}
	for name, stream := range map[string]string{
		"pretty, no separator":  pretty(a) + pretty(b),
		"compact, no separator": `{"timestamp":{"secs":1,"nanos":2},"source":"vm","event":"booted","properties":null}{"timestamp":{"secs":3,"nanos":999999999},"source":"virtio-device","event":"reset","properties":{"id":"_disk0"}}`,
		"mixed whitespace":      " \r\n\t" + pretty(a) + "\r\n \t" + pretty(b) + "\n\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			events, errs, end := decodeAll(t, strings.NewReader(stream))
			if end != io.EOF || len(errs) > 0 || !reflect.DeepEqual(events, []Event{a, b}) {
				t.Errorf("events %+v, errors %q, end %v", events, errs, end)
			}
		})
	}
}

// TestEventDecoderPartialWrites: an event split across reads at every byte decodes the
// same, and Next returns an event as soon as it is complete, without waiting for more.
func TestEventDecoderPartialWrites(t *testing.T) {
	stream, err := os.ReadFile("testdata/restore.events")
	if err != nil {
		t.Fatal(err)
	}
	whole, _, _ := decodeAll(t, strings.NewReader(string(stream)))
	bytewise, errs, end := decodeAll(t, iotest.OneByteReader(strings.NewReader(string(stream))))
	if end != io.EOF || len(errs) > 0 || len(whole) != 9 || !reflect.DeepEqual(whole, bytewise) {
		t.Fatalf("one byte per read: %d events, errors %q, end %v; whole: %d events", len(bytewise), errs, end, len(whole))
	}

	// Live: the writer stays open; each event arrives in two writes split mid-token.
	pr, pw := io.Pipe()
	defer pw.Close()
	d := NewEventDecoder(pr)
	for i, ev := range whole {
		text := pretty(ev) + "\n\n"
		cut := len(text) / 2
		got := make(chan Event, 1)
		go func() {
			ev, err := d.Next()
			if err != nil {
				t.Errorf("event %d: %v", i, err)
			}
			got <- ev
		}()
		if _, err := pw.Write([]byte(text[:cut])); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-got:
			t.Fatalf("Next returned %+v from half an event", ev)
		default:
		}
		if _, err := pw.Write([]byte(text[cut:])); err != nil {
			t.Fatal(err)
		}
		if g := <-got; !reflect.DeepEqual(g, ev) {
			t.Fatalf("event %d = %+v, want %+v", i, g, ev)
		}
	}
}

// TestEventDecoderGarbage: anything that is not an event is an *EventError naming where
// it is, and the decoder goes on with the next event.
func TestEventDecoderGarbage(t *testing.T) {
	good := pretty(Event{Timestamp: at(0, 5), Source: SourceVM, Event: EventPaused})
	betweenTokens := strings.Index(good, `"nanos"`) // after "secs": 0,\n and the indent
	if !strings.Contains(good[50:70], `"`) {
		t.Fatalf("good[:60] must end inside a string: %q", good[:60])
	}
	for _, tc := range []struct {
		name, stream string
		want         []string // substrings of the errors, in order
	}{
		{"text", "hello world\n" + good, []string{"byte 0: 'h' where an event should start"}},
		{"text without a newline before the event", "oops" + good + "\n" + good, []string{"byte 0: 'o'"}},
		{"an array", "[1,2]\n" + good, []string{"'['"}},
		{"not JSON inside", `{"timestamp": nope}` + "\n" + good, []string{"byte 0: not an event object"}},
		{"no timestamp", `{"source":"vm","event":"booted","properties":null}` + good, []string{"without timestamp"}},
		{"no nanos", `{"timestamp":{"secs":1},"source":"vm","event":"booted"}` + good, []string{"without timestamp"}},
		{"nanos of a second or more", `{"timestamp":{"secs":1,"nanos":1000000000},"source":"vm","event":"booted"}` + good, []string{"nanos 1000000000"}},
		{"secs overflow a Duration", `{"timestamp":{"secs":9223372036,"nanos":0},"source":"vm","event":"booted"}` + good, []string{"secs 9223372036"}},
		{"negative secs", `{"timestamp":{"secs":-1,"nanos":0},"source":"vm","event":"booted"}` + good, []string{"not an event object"}},
		{"no source", `{"timestamp":{"secs":1,"nanos":0},"event":"booted"}` + good, []string{"without source or event"}},
		{"a property that is not a string", `{"timestamp":{"secs":1,"nanos":0},"source":"vm","event":"x","properties":{"id":7}}` + good, []string{"not an event object"}},
		{"unbalanced closers", "{]]]}\n" + good, []string{"byte 0: not an event object", "byte 2: ']'"}},
		{"cut in a string, next event after the blank line", good[:60] + "\n\n" + good, []string{"byte 0: an event cut short inside a string"}},
		{"cut between tokens, next event after the blank line", good[:betweenTokens] + "\n\n" + good, []string{"byte 0: an event cut short: another began"}},
		{"cut, then garbage, then an event", good[:betweenTokens] + "\n\nzzz\n" + good, []string{"byte 0: an event cut short: another began"}},
		{"cut in a string, then garbage, then an event", good[:60] + "\n\nzzz\n" + good, []string{"byte 0: an event cut short inside a string"}},
		{"a NUL byte", "\x00\n" + good, []string{`'\x00'`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events, errs, end := decodeAll(t, strings.NewReader(tc.stream))
			if end != io.EOF {
				t.Errorf("end %v, want io.EOF", end)
			}
			if len(events) == 0 || events[len(events)-1].Event != EventPaused {
				t.Errorf("events %+v: the good event after the garbage is lost", events)
			}
			if len(errs) != len(tc.want) {
				t.Fatalf("errors %q, want %d", errs, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(errs[i], w) {
					t.Errorf("error %q lacks %q", errs[i], w)
				}
			}
		})
	}
}

// TestEventDecoderTooLarge: an object over MaxEventBytes is refused without holding it,
// and the event after it still decodes.
func TestEventDecoderTooLarge(t *testing.T) {
	good := pretty(Event{Timestamp: at(2, 0), Source: SourceVM, Event: EventResumed})
	huge := `{"source":"` + strings.Repeat("a", 10*MaxEventBytes) + "\"}\n"
	d := NewEventDecoder(strings.NewReader(huge + good))
	_, err := d.Next()
	var evErr *EventError
	if !errors.As(err, &evErr) || evErr.Offset != 0 || !strings.Contains(err.Error(), "longer than 65536 bytes") {
		t.Fatalf("Next on a %d-byte object: %v", len(huge), err)
	}
	if ev, err := d.Next(); err != nil || ev.Event != EventResumed {
		t.Fatalf("the event after it: %+v, %v", ev, err)
	}
	if cap(d.buf) > 2*MaxEventBytes {
		t.Errorf("the decoder holds %d bytes", cap(d.buf))
	}
	if _, err := d.Next(); err != io.EOF {
		t.Errorf("end: %v", err)
	}

	// Just under the bound is an event.
	props := `{"id":"` + strings.Repeat("b", MaxEventBytes-200) + `"}`
	big := `{"timestamp":{"secs":0,"nanos":1},"source":"vm","event":"booted","properties":` + props + "}"
	if ev, err := NewEventDecoder(strings.NewReader(big)).Next(); err != nil || len(ev.Properties["id"]) != MaxEventBytes-200 {
		t.Errorf("a %d-byte event: %v", len(big), err)
	}
}

// TestEventDecoderEnd: the end of the stream, clean or inside an event, and a failing
// reader; all are sticky.
func TestEventDecoderEnd(t *testing.T) {
	for name, stream := range map[string]string{"empty": "", "whitespace": "\n\n  \n"} {
		d := NewEventDecoder(strings.NewReader(stream))
		for range 2 {
			if _, err := d.Next(); err != io.EOF {
				t.Errorf("%s: %v, want io.EOF", name, err)
			}
		}
	}

	good := pretty(Event{Timestamp: at(0, 7), Source: SourceVMM, Event: EventShutdown})
	d := NewEventDecoder(strings.NewReader(good + "\n\n" + good[:50]))
	if ev, err := d.Next(); err != nil || ev.Event != EventShutdown {
		t.Fatalf("first: %+v, %v", ev, err)
	}
	for range 2 {
		_, err := d.Next()
		if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), fmt.Sprintf("byte %d", len(good)+2)) {
			t.Errorf("a stream ending inside an event: %v", err)
		}
	}

	boom := errors.New("boom")
	d = NewEventDecoder(io.MultiReader(strings.NewReader(good), iotest.ErrReader(boom)))
	if _, err := d.Next(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := d.Next(); !errors.Is(err, boom) {
			t.Errorf("a failing reader: %v", err)
		}
	}
}

// FuzzEventDecoder: no input panics the decoder, makes it loop, hold more than its bound
// or yield an event without source and event; and splitting the input into one-byte reads
// changes nothing.
func FuzzEventDecoder(f *testing.F) {
	for _, name := range []string{"testdata/lifecycle.events", "testdata/restore.events"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		f.Add(data[:len(data)/3])
		f.Add(append(append([]byte{}, data[:100]...), data[200:]...)) // a cut event
	}
	f.Add([]byte(`{"timestamp":{"secs":1,"nanos":2},"source":"guest","event":"panic","properties":{"event":"panic"}}{"timestamp":{"secs":1,"nanos":3},"source":"vm","event":"shutdown","properties":null}`))
	f.Add([]byte("garbage\n{\"a\":\"\\\"{\\n\"}\n{]"))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewEventDecoder(strings.NewReader(string(data)))
		var whole []string
		for calls := 0; ; calls++ {
			if calls > len(data)+1 {
				t.Fatalf("%d calls to Next on %d bytes", calls, len(data))
			}
			ev, err := d.Next()
			if cap(d.buf) > 2*MaxEventBytes {
				t.Fatalf("the decoder holds %d bytes", cap(d.buf))
			}
			var evErr *EventError
			if err == nil {
				if ev.Source == "" || ev.Event == "" || ev.Timestamp < 0 {
					t.Fatalf("event %+v", ev)
				}
				whole = append(whole, fmt.Sprintf("%+v", ev))
				continue
			}
			whole = append(whole, err.Error())
			if !errors.As(err, &evErr) {
				break
			}
		}
		var bytewise []string
		d = NewEventDecoder(iotest.OneByteReader(strings.NewReader(string(data))))
		for {
			ev, err := d.Next()
			var evErr *EventError
			if err == nil {
				bytewise = append(bytewise, fmt.Sprintf("%+v", ev))
				continue
			}
			bytewise = append(bytewise, err.Error())
			if !errors.As(err, &evErr) {
				break
			}
		}
		if !reflect.DeepEqual(whole, bytewise) {
			t.Fatalf("whole: %q\none byte per read: %q", whole, bytewise)
		}
	})
}
