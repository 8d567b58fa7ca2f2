package session

import (
	"testing"
	"time"
)

func TestValidID(t *testing.T) {
	id := NewID("snap_", time.Now())
	if !ValidID("snap_", id) {
		t.Fatalf("%q refused", id)
	}
	for _, bad := range []string{"", "snap_", "../x", "snap_../../../../../../../x", id + "x", id[:len(id)-1] + "/", "sess_" + id[5:]} {
		if ValidID("snap_", bad) {
			t.Fatalf("%q accepted", bad)
		}
	}
}
