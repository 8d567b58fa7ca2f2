package node

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"wb/hypervisor/templates"
	"wb/internal/redistest"
	"wb/session"
	"wb/store"
)

// shortTempDir is a temporary directory with a short path: a Unix socket's path must fit in
// 108 bytes, which t.TempDir's long names can pass.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "wbr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestResumeFileIgnoresAGuestSymlink: under gVisor the agent dir is the guest's to write, so
// guest root can put its own agent on the socket, plant a symlink to a host file where the
// quiesce's resume file goes, and fail the quiesce. The node then makes the resume file (the
// agent may have quiesced and lost its answer): it must not follow the symlink, which once
// truncated the host file as root.
func TestResumeFileIgnoresAGuestSymlink(t *testing.T) {
	dir := shortTempDir(t)
	host := filepath.Join(shortTempDir(t), "precious")
	if err := os.WriteFile(host, []byte("host data"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := memorySnapshots{checkpoints: make(chan string, 1)}
	n, err := New(Config{Store: store.New(redistest.Server(t)), Driver: d, Templates: templates.Catalog{"tpl": {}}, DataDir: dir,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	close(n.recovered)
	const guestID = "g_evil"
	agentDir := filepath.Join(n.guestDir(guestID), "agent")
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(agentDir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	planted := make(chan error, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The guest's imposter agent: a symlink where the resume file goes, and a failure.
		var q struct {
			ResumeFile string `json:"resume_file"`
		}
		err := json.NewDecoder(r.Body).Decode(&q)
		if err == nil {
			err = os.Symlink(host, filepath.Join(agentDir, filepath.Base(q.ResumeFile)))
		}
		planted <- err
		w.WriteHeader(http.StatusInternalServerError)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	now := time.Now()
	l := &live{agent: n.agentFor(guestID), g: &guest{SessionID: "sess_evil", Project: "proj_evil", GuestID: guestID,
		State: session.Running, Template: "tpl", Tier: 2, StartedAt: now, SampledAt: now, IdleTimeoutS: 600, MaxLifetimeS: 3600}}
	n.guests["sess_evil"] = l
	const snap = "snap_0123456789abcdefgh"
	if _, err := n.takeSnapshot(context.Background(), &session.Session{ID: "sess_evil", ProjectID: "proj_evil"}, snap, true); err == nil {
		t.Fatal("the snapshot succeeded though the agent failed its quiesce")
	}
	select {
	case err := <-planted:
		if err != nil {
			t.Fatalf("the imposter agent planted no symlink: %v", err)
		}
	default:
		t.Fatal("the imposter agent was never asked to quiesce")
	}
	if b, err := os.ReadFile(host); err != nil || string(b) != "host data" {
		t.Fatalf("the host file outside the agent dir now holds %q (%v): the node followed the guest's symlink", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(agentDir, resumeFile(snap))); err != nil || fi.Mode().Type() != fs.ModeSymlink {
		t.Fatalf("the resume file's name: %v, %v; want the guest's symlink left as it was", fi, err)
	}
}

// TestResumeAgentMakesOnlyARegularFile: the resume file is created in the agent dir itself,
// or an empty regular file already there is taken as it; whatever else a guest put at its
// name (a symlink, dangling or not, a fifo, a directory) is refused, and nothing outside the
// agent dir is created or touched.
func TestResumeAgentMakesOnlyARegularFile(t *testing.T) {
	n := &Node{Config: Config{DataDir: shortTempDir(t)}}
	const guestID, name = "g_evil", "resume-snap_0123456789abcdefgh"
	agentDir := filepath.Join(n.guestDir(guestID), "agent")
	for _, c := range []struct {
		what  string
		plant func(path, outside string) error
		ok    bool
	}{
		{"nothing", func(string, string) error { return nil }, true},
		{"a regular file", func(p, _ string) error { return os.WriteFile(p, nil, 0o644) }, true},
		{"a symlink to a host file", func(p, outside string) error {
			host := filepath.Join(outside, "precious")
			if err := os.WriteFile(host, []byte("host data"), 0o600); err != nil {
				return err
			}
			return os.Symlink(host, p)
		}, false},
		{"a dangling symlink", func(p, outside string) error { return os.Symlink(filepath.Join(outside, "made"), p) }, false},
		{"a symlink to a file in the agent dir", func(p, _ string) error {
			if err := os.WriteFile(filepath.Join(agentDir, "other"), nil, 0o644); err != nil {
				return err
			}
			return os.Symlink("other", p)
		}, false},
		{"a fifo", func(p, _ string) error { return syscall.Mkfifo(p, 0o644) }, false},
		{"a directory", func(p, _ string) error { return os.Mkdir(p, 0o755) }, false},
	} {
		t.Run(c.what, func(t *testing.T) {
			if err := os.RemoveAll(agentDir); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(agentDir, 0o755); err != nil {
				t.Fatal(err)
			}
			outside := shortTempDir(t)
			p := filepath.Join(agentDir, name)
			if err := c.plant(p, outside); err != nil {
				t.Fatal(err)
			}
			err := n.resumeAgent(guestID, name)
			if c.ok {
				if err != nil {
					t.Fatalf("resumeAgent: %v", err)
				}
				if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
					t.Fatalf("the resume file: %v, %v; want a regular file", fi, err)
				}
				return
			}
			if err == nil {
				t.Fatal("resumeAgent made the resume file through what the guest planted")
			}
			if b, err := os.ReadFile(filepath.Join(outside, "precious")); err == nil && string(b) != "host data" {
				t.Fatalf("the host file now holds %q", b)
			}
			if _, err := os.Lstat(filepath.Join(outside, "made")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("the dangling symlink's target: %v; want it never created", err)
			}
		})
	}
}
