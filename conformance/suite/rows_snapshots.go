package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"wb/client"
)

// restoreFixture is a session with a file (and a background process) snapshotted, and the
// new session restored from the snapshot.
type restoreFixture struct {
	from, restored *client.Session
	snap           *client.Snapshot
	file           string
	process        bool // the background process runs in the restored session
}

func restored(ctx context.Context, e *Env, memory bool) (*restoreFixture, error) {
	return shared(ctx, e, fmt.Sprintf("restore-memory-%v", memory), func(ctx context.Context, e *Env) (*restoreFixture, error) {
		s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
		if err != nil {
			return nil, err
		}
		// The process is found again by its command line, which a restore of memory keeps.
		if _, err := e.Sh(ctx, s.ID, `echo kept > /workspace/f; sleep 424242 >/dev/null 2>&1 &`); err != nil {
			return nil, err
		}
		f := &restoreFixture{from: s}
		if f.snap, err = e.Snapshot(ctx, s.ID, memory); err != nil {
			return nil, err
		}
		n, err := e.CreateSession(ctx, client.CreateSessionRequest{Tier: 2, RestoreFrom: f.snap.ID})
		if err != nil {
			return nil, fmt.Errorf("restore_from %s: %w", f.snap.ID, err)
		}
		if f.restored, err = e.WaitState(ctx, n.ID, "running"); err != nil {
			return nil, err
		}
		out, _ := e.Sh(ctx, n.ID, "cat /workspace/f")
		f.file = strings.TrimSpace(out)
		ps, _ := e.Sh(ctx, n.ID, "ps -o args 2>/dev/null || ps")
		f.process = strings.Contains(ps, "sleep 424242")
		return f, nil
	})
}

func snapshotRows() []Row {
	const st = "Snapshots"
	return []Row{
		{Seed: "000", Table: st, Row: "include_memory false → restore_from: a new session with the disk", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := restored(ctx, e, false)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("%s → %s → %s (restore_from %s); file %q; process running %v", f.from.ID, f.snap.ID, f.restored.ID, deref(f.restored.RestoreFrom), f.file, f.process)
			switch {
			case f.restored.ID == f.from.ID:
				return saw, errors.New("want a new session id")
			case f.file != "kept":
				return saw, errors.New("want the file back")
			case f.process:
				return saw, errors.New("a disk-only snapshot brought a process back")
			}
			return saw, nil
		}},
		{Seed: "000", Table: st, Row: "include_memory true → restore_from: a new session, memory back where the back end can", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := restored(ctx, e, true)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("%s → %s (include_memory %v) → %s; file %q; process running %v", f.from.ID, f.snap.ID, f.snap.IncludeMemory, f.restored.ID, f.file, f.process)
			// A back end that cannot save memory says so on the snapshot (include_memory
			// false); one that says it saved memory must bring the process back.
			switch {
			case f.restored.ID == f.from.ID:
				return saw, errors.New("want a new session id")
			case f.file != "kept":
				return saw, errors.New("want the file back")
			case f.snap.IncludeMemory && !f.process:
				return saw, errors.New("the snapshot holds memory, yet the restored session lacks the process")
			case !f.snap.IncludeMemory && f.process:
				return saw, errors.New("the snapshot says it holds no memory, yet the process came back")
			}
			if !f.snap.IncludeMemory {
				saw += " (this back end saves the disk only, and says so)"
			}
			return saw, nil
		}},
		{Seed: "000", Table: "Pause and resume", Row: "Same session ID | snapshot → restore: No, a new session", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := restored(ctx, e, false)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("snapshot of %s restored as %s", f.from.ID, f.restored.ID)
			if f.restored.ID == f.from.ID {
				return saw, errors.New("want a new id")
			}
			return saw, nil
		}},
		{Seed: "000", Table: st, Row: "snapshot object: id, object, session_id, include_memory, state, size_bytes, created_at", Check: func(ctx context.Context, e *Env) (string, error) {
			f, err := restored(ctx, e, false)
			if err != nil {
				return "", err
			}
			g, err := e.C.GetSnapshot(ctx, f.snap.ID)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("%s object %q session_id %s include_memory %v state %s size_bytes %d", g.ID, g.Object, g.SessionID, g.IncludeMemory, g.State, g.SizeBytes)
			switch {
			case !strings.HasPrefix(g.ID, "snap_") || g.Object != "snapshot" || g.SessionID != f.from.ID:
				return saw, errors.New(`want id snap_…, object "snapshot", session_id of the session`)
			case g.State != "ready" || g.SizeBytes <= 0 || g.CreatedAt.IsZero():
				return saw, errors.New("want state ready, size_bytes > 0 and created_at")
			}
			return saw, nil
		}},
		{Seed: "000", Table: st, Row: "DELETE /v1/snapshots/{id}: gone", Check: func(ctx context.Context, e *Env) (string, error) {
			s, err := e.Running(ctx, client.CreateSessionRequest{Tier: 2})
			if err != nil {
				return "", err
			}
			snap, err := e.Snapshot(ctx, s.ID, false)
			if err != nil {
				return "", err
			}
			d, err := e.C.DeleteSnapshot(ctx, snap.ID)
			if err != nil {
				return "", err
			}
			_, getErr := e.C.GetSnapshot(ctx, snap.ID)
			n, restoreErr := e.C.CreateSession(ctx, client.CreateSessionRequest{Tier: 2, RestoreFrom: snap.ID, EndUserID: e.Tag()})
			if restoreErr == nil {
				e.tracker().add(&e.tracker().sessions, n.ID)
			}
			saw := fmt.Sprintf("DELETE answered deleted %v; GET → %s; restore_from → %s", d.Deleted, statusOf(getErr), statusOf(restoreErr))
			if !d.Deleted || apiStatus(getErr) != 404 || restoreErr == nil {
				return saw, errors.New("want deleted, GET 404 and a restore refused")
			}
			return saw, nil
		}},
	}
}
