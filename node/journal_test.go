package node_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"wb/session"
)

// TestExecsWriteTheJournalRarely: an exec is activity, which resets the idle timer, but the
// journal (a file replaced by rename: about 0.6 ms here, which ext4 flushes) learns of it at
// most once a second; every exec wrote it twice. Each write renames a new file over the old
// one, which inotify counts.
func TestExecsWriteTheJournalRarely(t *testing.T) {
	t.Parallel()
	st, _ := newStore(t)
	dataDir := tempDir(t)
	n := startNode(t, nodeConfig(t, st, newDriver(t, "runc", tempDir(t)), dataDir, "node_journal"))
	s := provision(t, st, n.Node, "proj_journal", sessionOpts{idleS: 300, lifeS: 600})
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// Each write creates the file's .tmp, then renames it: watching both keeps every rename
	// apart (inotify merges an event into the unread one before it when they are the same).
	if _, err := unix.InotifyAddWatch(fd, filepath.Join(dataDir, "journal"), unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	const execs = 80
	start := time.Now()
	for range execs {
		if res, err := execIn(ctxT(t, 30*time.Second), n.Node, s, "true"); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec true: %+v, %v", res, err)
		}
	}
	writes := 0
	buf := make([]byte, 64<<10)
	for {
		k, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			if ev.Mask&unix.IN_MOVED_TO != 0 && string(bytes.TrimRight(name, "\x00")) == s.ID+".json" {
				writes++
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
	// Once a second for the activity, and twice a second for the node's usage flush
	// (nodeConfig's Flush: it saves the sample it queued, then the journal without it once
	// Redis has it), for every second begun; and a few for the session's start, whose flushes
	// may still land, and for flushes that Redis did not take in time and that a replay
	// writes again: 4 a second and 6 more (a cold make test's 40 execs took 7.9 s and wrote it
	// 32 times, beyond the 28 that 3 a second and 4 more allowed). When every exec wrote it,
	// 80 execs wrote it 80 or 160 times, above this bound for any run of up to 18 s.
	elapsed := time.Since(start)
	if most := 6 + 4*int((elapsed+time.Second-1)/time.Second); writes > most {
		t.Fatalf("%d execs in %v wrote the journal %d times, want at most %d", execs, time.Since(start).Round(time.Millisecond), writes, most)
	}
	t.Logf("%d execs in %v wrote the journal %d times", execs, time.Since(start).Round(time.Millisecond), writes)
}

// TestRestartKeepsUnjournaledActivity: activity the journal did not learn of (a second exec
// within activitySaved of the first, which wrote it) still holds the idle timer off after a
// restart: the restarted node's timer fires no sooner than the idle timeout after that exec.
func TestRestartKeepsUnjournaledActivity(t *testing.T) {
	t.Parallel()
	const project = "proj_journal_restart"
	st, _ := newStore(t)
	a, _, reopen := restartableNode(t, st, "runc", "node_journal_restart")
	s := provision(t, st, a.Node, project, sessionOpts{idleS: 30, lifeS: 600})
	if _, err := execIn(ctxT(t, 30*time.Second), a.Node, s, "true"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	last := time.Now()
	if _, err := execIn(ctxT(t, 30*time.Second), a.Node, s, "true"); err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	_, cfg := reopen()
	startNode(t, cfg)
	deadline := last.Add(30 * time.Second)
	stopping := waitEvent(t, st, project, s.ID, session.EventStopping, 1, time.Until(deadline)+margin+teardown)
	// Up to activitySaved late is by design (the journal counts that much ahead).
	within(t, "the idle timer after the restart", atMs(stopping.AtMs), deadline, deadline.Add(margin))
}
