package cloudhv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv/chapi"
)

// Events follows the guest: its VMM's event log (events, read from the start, so an end written
// before the call is seen too) and its process. vm/shutdown, vmm/shutdown or guest/panic in the
// log, or the VMM's exit, is one EventExit, after which the channel closes. An OOM happens
// inside the guest's own kernel, which tells the host nothing of a process it kills; so the
// guest boots with panic_on_oom (see kernelCmdline), and a panic whose console says "Out of
// memory" is an EventOOM before the EventExit.
func (d *Driver) Events(ctx context.Context, id string) (<-chan hypervisor.Event, error) {
	r, err := d.load(id)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(d.GuestDir(id), eventsFile))
	if err != nil {
		return nil, fmt.Errorf("cloudhv: guest %s: event log: %w", id, err)
	}
	ch := make(chan hypervisor.Event, 1)
	go func() {
		defer close(ch)
		defer f.Close()
		why := d.watch(ctx, r, f)
		if why == "" {
			return // ctx ended
		}
		if why == guestPanic && d.outOfMemory(r) {
			select {
			case ch <- hypervisor.Event{Type: hypervisor.EventOOM, At: time.Now()}:
			case <-ctx.Done():
				return
			}
		}
		ev := hypervisor.Event{Type: hypervisor.EventExit, At: time.Now(), Detail: d.exitDetail(r, why)}
		select {
		case ch <- ev:
		case <-ctx.Done():
		}
	}()
	return ch, nil
}

// guestPanic is watch's answer for a guest/panic event.
var guestPanic = fmt.Sprintf("event %s/%s", chapi.SourceGuest, chapi.EventPanic)

// outOfMemory reports whether the guest's kernel panicked for want of memory: Linux says so
// on the console ("Kernel panic - not syncing: Out of memory: ...") before pvpanic reports
// it. The line reaches the console log through the terminal's copy (startConsole), which
// may not have written it yet: it waits up to panicLineWait for a panic line.
func (d *Driver) outOfMemory(r record) bool {
	dir := d.GuestDir(r.Spec.ID)
	deadline := time.Now().Add(panicLineWait)
	for {
		t := consoleTail(dir, 4096)
		if strings.Contains(t, "not syncing: Out of memory") {
			return true
		}
		if strings.Contains(t, "Kernel panic - not syncing") || time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// panicLineWait bounds outOfMemory's wait for the panic line: a copy of a few bytes that
// takes microseconds, given a loaded host's scheduling.
const panicLineWait = 2 * time.Second

// watch reads the event log until the guest ends (answering why) or ctx ends ("").
func (d *Driver) watch(ctx context.Context, r record, f *os.File) string {
	// The log is complete once the VMM has exited and this process's copy of its pipe, if it
	// serves one, has ended.
	alive := func() bool { return r.alive() || d.copying(r.Spec.ID, eventsFile) }
	dec := chapi.NewEventDecoder(&tailReader{ctx: ctx, f: f, interval: d.o.EventInterval, alive: alive})
	for {
		ev, err := dec.Next()
		var bad *chapi.EventError
		switch {
		case errors.As(err, &bad):
			d.log.Warn("event log: skipped", "id", r.Spec.ID, "err", err)
			continue
		case err != nil && ctx.Err() != nil:
			return ""
		case err != nil:
			return "the VMM exited"
		}
		switch {
		case ev.Source == chapi.SourceGuest && ev.Event == chapi.EventPanic,
			ev.Source == chapi.SourceVM && ev.Event == chapi.EventShutdown,
			ev.Source == chapi.SourceVMM && ev.Event == chapi.EventShutdown:
			return fmt.Sprintf("event %s/%s", ev.Source, ev.Event)
		}
	}
}

// tailReader reads a file that another process appends to: at its end it waits for more
// until ctx ends (ctx.Err()) or alive says the writer is gone (io.EOF once all is read).
type tailReader struct {
	ctx      context.Context
	f        *os.File
	interval time.Duration
	alive    func() bool
}

func (t *tailReader) Read(p []byte) (int, error) {
	for {
		n, err := t.f.Read(p)
		if n > 0 || (err != nil && !errors.Is(err, io.EOF)) {
			return n, err
		}
		if !t.alive() {
			// Whatever it wrote before exiting is in the file now.
			if n, err := t.f.Read(p); n > 0 {
				return n, err
			}
			return 0, io.EOF
		}
		select {
		case <-t.ctx.Done():
			return 0, t.ctx.Err()
		case <-time.After(t.interval):
		}
	}
}

// exitDetail says how the guest ended, for the node's log: why, the VMM's exit status when
// this process reaped it, and the tails of its log and the guest's console.
func (d *Driver) exitDetail(r record, why string) string {
	var b strings.Builder
	b.WriteString(why)
	if v, ok := d.exited.Load(r.Pid); ok {
		ex := v.(*exitInfo)
		select {
		case <-ex.done:
			fmt.Fprintf(&b, " (%s)", ex.status)
			d.awaitVMMLog(r.Spec.ID)
		default:
		}
	}
	dir := d.GuestDir(r.Spec.ID)
	fmt.Fprintf(&b, "; VMM log tail: %q; console tail: %q", tail(filepath.Join(dir, vmmLogFile), 1024), consoleTail(dir, 1024))
	return b.String()
}
