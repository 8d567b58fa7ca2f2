package desktop_test

import (
	"testing"
	"time"

	"wb/desktop"
)

// TestDesktopSeedRowsOnGuests walks the rows of seed 001's transitions table that
// TestDesktopWhatIsKept does not, with a real runsc guest: asleep → Stop (stopped at once,
// the snapshot discarded: the start after it is fresh from the disk, the file kept, the
// process gone) and running or starting → Stop (a stop while it starts).
func TestDesktopSeedRowsOnGuests(t *testing.T) {
	t.Parallel()
	p := startPlatform(t, nil)
	var d desktop.Desktop
	p.call("POST", "/v1/desktops", map[string]any{"name": "rows"}, 201, &d)
	d = p.wait(d.ID, desktop.Running)
	p.sh(d, "mkdir -p "+memoryDir+" && echo on-disk > "+memoryDir+"/note")
	p.sh(d, "sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /workspace/bg.pid")

	// asleep → Stop: stopped at once; the saved state is discarded.
	p.call("POST", "/v1/desktops/"+d.ID+":sleep", nil, 202, &d)
	d = p.wait(d.ID, desktop.Asleep)
	if !d.StateSaved {
		t.Fatalf("asleep without its state: %s", d.Message)
	}
	var stopped desktop.Desktop // fresh: the API leaves out state_saved and session_id when unset
	p.call("POST", "/v1/desktops/"+d.ID+":stop", nil, 200, &stopped)
	if stopped.State != desktop.Stopped || stopped.StateSaved {
		t.Fatalf("stop of an asleep desktop answered %+v, want stopped at once without saved state", stopped)
	}
	// An agent's call no longer wakes it: Wake is refused, Start starts it fresh.
	p.call("POST", "/v1/desktops/"+d.ID+":wake", nil, 409, nil)
	p.call("POST", "/v1/desktops/"+d.ID+":start", nil, 202, &d)
	d = p.wait(d.ID, desktop.Running)
	if got := p.sh(d, "cat "+memoryDir+"/note"); got != "on-disk" {
		t.Errorf("after asleep → stop → start the file holds %q", got)
	}
	if p.running(d) {
		t.Error("after asleep → stop → start the process survived: the discarded snapshot was restored")
	}

	// starting → Stop: a stop while the desktop starts wins; it ends stopped, its session gone.
	p.call("POST", "/v1/desktops/"+d.ID+":stop", nil, 202, &d)
	d = p.wait(d.ID, desktop.Stopped)
	var starting desktop.Desktop
	p.call("POST", "/v1/desktops/"+d.ID+":start", nil, 202, &starting)
	if starting.State != desktop.Starting {
		t.Fatalf("start answered %s", starting.State)
	}
	p.call("POST", "/v1/desktops/"+d.ID+":stop", nil, 202, nil)
	if d = p.wait(d.ID, desktop.Stopped); d.SessionID != "" {
		t.Errorf("stopped while starting, yet it has session %s", d.SessionID)
	}
	// Nothing of the interrupted start runs on: no session of the project is left up.
	deadline := time.Now().Add(time.Minute)
	for up := p.liveSessions(); len(up) > 0; up = p.liveSessions() {
		if time.Now().After(deadline) {
			t.Fatalf("sessions left up after a stop while starting: %v", up)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.call("DELETE", "/v1/desktops/"+d.ID, nil, 200, nil)
}

// liveSessions lists the project's sessions that are pending, provisioning or running.
func (p *platform) liveSessions() []string {
	p.t.Helper()
	var up []string
	for _, st := range []string{"pending", "provisioning", "running"} {
		var list struct {
			Data []struct{ ID string } `json:"data"`
		}
		p.call("GET", "/v1/sessions?state="+st, nil, 200, &list)
		for _, s := range list.Data {
			up = append(up, s.ID+" "+st)
		}
	}
	return up
}
