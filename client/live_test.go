//go:build linux

package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"wb/internal/servetest"
)

// TestLive drives a real `wb serve` with runc guests through the SDK: one tier-2 session
// (create → streamed exec → files → pause/resume → snapshot → PTY with resize → delete), one
// session restored from the snapshot, and the typed errors of a 400 and a 404.
func TestLive(t *testing.T) {
	if testing.Short() {
		t.Skip("starts wb serve with real guests")
	}
	srv := servetest.Start(t)
	c, err := New(srv.URL, srv.APIKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	defer func() {
		if t.Failed() {
			t.Logf("wb serve's log:\n%s", srv.Log())
		}
	}()

	t.Run("errors", func(t *testing.T) {
		_, err := c.CreateSession(ctx, CreateSessionRequest{Tier: 9})
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || e.Type != "invalid_request" || e.Param != "tier" || e.Code == "" || e.Message == "" {
			t.Errorf("create with tier 9: %#v, want *Error 400 invalid_request on param tier", err)
		}
		_, err = c.GetSession(ctx, "sess_doesnotexist")
		if !errors.As(err, &e) || e.Status != 404 || e.Type != "not_found" || e.Code == "" {
			t.Errorf("get of an unknown session: %#v, want *Error 404 not_found", err)
		}
	})

	s, err := c.CreateSession(ctx, CreateSessionRequest{Tier: 2, Metadata: map[string]string{"sdk": "go"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer c.DeleteSession(context.Background(), s.ID)
	if s, err = c.WaitSession(ctx, s.ID, "running"); err != nil {
		t.Fatalf("await running: %v", err)
	}
	if s.Metadata["sdk"] != "go" || s.Tier != 2 {
		t.Errorf("session %+v: metadata or tier lost", s)
	}

	t.Run("list", func(t *testing.T) {
		found := false
		for got, err := range c.AllSessions(ctx, ListSessionsRequest{Page: Page{Limit: 1}, State: "running"}) {
			if err != nil {
				t.Fatal(err)
			}
			found = found || got.ID == s.ID
		}
		if !found {
			t.Errorf("AllSessions(state=running) did not yield %s", s.ID)
		}
	})

	t.Run("exec stream", func(t *testing.T) {
		var out, errOut bytes.Buffer
		var end *ExecEnd
		for ev, err := range c.ExecStream(ctx, s.ID, ExecRequest{Command: "echo one; echo two >&2; printf '\\377'; exit 7"}) {
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case ev.End != nil:
				end = ev.End
			case ev.Stream == "stderr":
				errOut.Write(ev.Data)
			default:
				out.Write(ev.Data)
			}
		}
		if end == nil || end.ExitCode != 7 || out.String() != "one\n\xff" || errOut.String() != "two\n" {
			t.Errorf("stream: end %+v stdout %q stderr %q; want exit 7, \"one\\n\\xff\", \"two\\n\"", end, out.String(), errOut.String())
		}
		res, err := c.ExecCollect(ctx, s.ID, ExecRequest{Argv: []string{"/bin/sh", "-c", "cat; echo $X"}, Stdin: "in\n", Env: map[string]string{"X": "y"}})
		if err != nil || res.ExitCode != 0 || res.Stdout != "in\ny\n" {
			t.Errorf("collect: %+v, %v; want stdout \"in\\ny\\n\"", res, err)
		}
		buf, err := c.Exec(ctx, s.ID, ExecRequest{Command: "echo buffered"})
		if err != nil || buf.Stdout != "buffered\n" {
			t.Errorf("buffered exec: %+v, %v", buf, err)
		}
	})

	t.Run("files", func(t *testing.T) {
		content := []byte("hello\x00world\n")
		if err := c.UploadFile(ctx, s.ID, "/tmp/sdk/f.bin", bytes.NewReader(content)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		got, err := c.DownloadFile(ctx, s.ID, "/tmp/sdk/f.bin")
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("download: %q, %v; want %q", got, err, content)
		}
		l, err := c.ListFiles(ctx, s.ID, "/tmp/sdk/")
		if err != nil || len(l.Data) != 1 || l.Data[0].Name != "f.bin" || l.Data[0].Size != int64(len(content)) {
			t.Fatalf("list: %+v, %v", l, err)
		}
		if err := c.DeleteFile(ctx, s.ID, "/tmp/sdk/f.bin"); err != nil {
			t.Fatalf("delete: %v", err)
		}
		_, err = c.DownloadFile(ctx, s.ID, "/tmp/sdk/f.bin")
		var e *Error
		if !errors.As(err, &e) || e.Status != 404 {
			t.Errorf("download after delete: %v, want a 404 *Error", err)
		}
	})

	t.Run("pause resume", func(t *testing.T) {
		p, err := c.PauseSession(ctx, s.ID)
		if err != nil || p.State != "paused" {
			t.Fatalf("pause: %+v, %v", p, err)
		}
		_, err = c.Exec(ctx, s.ID, ExecRequest{Command: "true"})
		var e *Error
		if !errors.As(err, &e) || e.Status != 409 || e.Type != "invalid_state" {
			t.Errorf("exec while paused: %v, want 409 invalid_state", err)
		}
		r, err := c.ResumeSession(ctx, s.ID)
		if err != nil || r.State != "running" {
			t.Fatalf("resume: %+v, %v", r, err)
		}
	})

	t.Run("pty", func(t *testing.T) { testPTY(t, ctx, c, s.ID) })

	t.Run("snapshot restore", func(t *testing.T) {
		if _, err := c.Exec(ctx, s.ID, ExecRequest{Command: "echo kept > /root/mark"}); err != nil {
			t.Fatal(err)
		}
		snap, err := c.SnapshotSession(ctx, s.ID, SnapshotRequest{})
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		for snap.State == "creating" {
			time.Sleep(200 * time.Millisecond)
			if snap, err = c.GetSnapshot(ctx, snap.ID); err != nil {
				t.Fatal(err)
			}
		}
		if snap.State != "ready" || snap.SessionID != s.ID {
			t.Fatalf("snapshot %+v, want ready, of %s", snap, s.ID)
		}
		listed := false
		for got, err := range c.AllSnapshots(ctx, Page{}) {
			if err != nil {
				t.Fatal(err)
			}
			listed = listed || got.ID == snap.ID
		}
		if !listed {
			t.Errorf("AllSnapshots did not yield %s", snap.ID)
		}
		r, err := c.CreateSession(ctx, CreateSessionRequest{Tier: 2, RestoreFrom: snap.ID})
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		defer c.DeleteSession(context.Background(), r.ID)
		if _, err := c.WaitSession(ctx, r.ID, "running"); err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(ctx, r.ID, ExecRequest{Command: "cat /root/mark"})
		if err != nil || res.Stdout != "kept\n" {
			t.Errorf("the restored session's file: %+v, %v", res, err)
		}
		if _, err := c.DeleteSession(ctx, r.ID); err != nil {
			t.Error(err)
		}
		d, err := c.DeleteSnapshot(ctx, snap.ID)
		if err != nil || !d.Deleted || d.ID != snap.ID {
			t.Errorf("delete snapshot: %+v, %v", d, err)
		}
	})

	d, err := c.DeleteSession(ctx, s.ID)
	if err != nil || (d.State != "stopping" && d.State != "stopped") {
		t.Fatalf("delete: %+v, %v", d, err)
	}
	if _, err := c.WaitSession(ctx, s.ID, "stopped"); err != nil {
		t.Error(err)
	}
}

// ptyOutput collects what a PTY prints, for awaiting text in it.
type ptyOutput struct {
	mu   sync.Mutex
	buf  strings.Builder
	done chan struct{}
	err  error
}

func (o *ptyOutput) await(t *testing.T, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		o.mu.Lock()
		out := o.buf.String()
		o.mu.Unlock()
		if i := strings.Index(out[from:], want); i >= 0 {
			return from + i + len(want)
		}
		select {
		case <-o.done:
			t.Fatalf("the PTY closed (%v) before printing %q; output: %q", o.err, want, out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the PTY printed no %q within a minute; output: %q", want, out)
		}
	}
}

// testPTY: a shell's output comes back, a resize reaches the terminal (stty size), and the
// shell's exit code is the PTY's.
func testPTY(t *testing.T, ctx context.Context, c *Client, id string) {
	p, err := c.OpenPTY(ctx, id, PTYRequest{Cols: 80, Rows: 24})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer p.Close()
	o := &ptyOutput{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		b := make([]byte, 4096)
		for {
			n, err := p.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			if err != nil {
				if err != io.EOF {
					o.err = err
				}
				return
			}
		}
	}()
	if _, err := p.Write([]byte("stty size\r")); err != nil {
		t.Fatal(err)
	}
	off := o.await(t, 0, "24 80")
	if err := p.Resize(ctx, 100, 40); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Write([]byte("stty size\r")); err != nil {
		t.Fatal(err)
	}
	o.await(t, off, "40 100")
	if _, err := p.Write([]byte("exit 3\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.done:
	case <-time.After(time.Minute):
		t.Fatal("the PTY did not end within a minute of exit 3")
	}
	if o.err != nil {
		t.Errorf("read: %v", o.err)
	}
	if code, ok := p.ExitCode(); !ok || code != 3 {
		t.Errorf("exit code %d (known %v), want 3", code, ok)
	}
}
