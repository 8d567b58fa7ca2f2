package store

import (
	"context"
	"testing"

	"wb/internal/redistest"
	"wb/session"
)

// TestPutObjectIfAbsent: an object written only if absent is written once, and never over
// one already there (a snapshot its gateway recorded ready stays ready whatever a recovery
// finds late); it is listed, and its project indexed for the storage bill, like any other.
func TestPutObjectIfAbsent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := New(redistest.Server(t))
	ready := session.Snapshot{ID: "snap_a", State: session.SnapshotReady}
	failed := session.Snapshot{ID: "snap_a", State: session.SnapshotFailed}
	if err := s.PutObject(ctx, "proj_o", KindSnapshot, "snap_a", ready); err != nil {
		t.Fatal(err)
	}
	if set, err := s.PutObjectIfAbsent(ctx, "proj_o", KindSnapshot, "snap_a", failed); err != nil || set {
		t.Fatalf("over a recorded object: %v, %v; want false", set, err)
	}
	var got session.Snapshot
	if err := s.GetObject(ctx, "proj_o", KindSnapshot, "snap_a", &got); err != nil || got.State != session.SnapshotReady {
		t.Fatalf("after it: %+v, %v; want it still ready", got, err)
	}
	failed.ID = "snap_b"
	if set, err := s.PutObjectIfAbsent(ctx, "proj_o2", KindSnapshot, "snap_b", failed); err != nil || !set {
		t.Fatalf("where none was: %v, %v; want true", set, err)
	}
	if err := s.GetObject(ctx, "proj_o2", KindSnapshot, "snap_b", &got); err != nil || got.State != session.SnapshotFailed {
		t.Fatalf("the object written: %+v, %v", got, err)
	}
	if list, _, err := s.ListObjects(ctx, "proj_o2", KindSnapshot, 10, ""); err != nil || len(list) != 1 {
		t.Fatalf("listed: %d, %v; want 1", len(list), err)
	}
	projects, err := s.rdb.SMembers(ctx, snapshotProjectsKey).Result()
	if err != nil || len(projects) != 2 {
		t.Fatalf("projects indexed for snapshots: %v, %v; want both", projects, err)
	}
}
