package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	gorunc "github.com/containerd/go-runc"
)

// runscImageFile is the file `runsc checkpoint --image-path DIR` writes in DIR, and `runsc
// restore --image-path DIR` reads.
const runscImageFile = "checkpoint.img"

// checkpoint saves runsc guest id, memory and all, into the image directory img (which
// stops it). It asks the guest's sandbox itself, over its control socket, as `runsc
// checkpoint` does, without starting runsc: that process's start and its loading of the
// container's state took 23 ms before it asked the sandbox (runsc's debug log, a loaded
// 2-core host), and a trivial runsc command 100–500 ms at a load of 8–35. A sandbox that
// has no control socket where this runsc build has it, or that does not know the call, is
// checkpointed by `runsc checkpoint`. The guest's agent must have let go of everything first
// (its quiesce answer says "released"): with no process start in between, the save begins
// the moment the quiesce is answered.
func (d *Driver) checkpoint(ctx context.Context, id, img string) error {
	err := fmt.Errorf("%w: runsc's build is not one whose checkpoint call this driver knows", errNoDirectCheckpoint)
	if d.directCheckpoint {
		err = checkpointSandbox(ctx, id, img)
	}
	if errors.Is(err, errNoDirectCheckpoint) {
		d.log.Debug("checkpoint through runsc", "id", id, "why", err)
		_ = os.Remove(filepath.Join(img, runscImageFile)) // runsc creates it and refuses one that exists
		err = d.rt.Checkpoint(ctx, id, &gorunc.CheckpointOpts{ImagePath: img})
	}
	if err != nil {
		return d.wrap("checkpoint", id, err)
	}
	return nil
}

// directCheckpointBuild is the runsc build whose sandbox's checkpoint call checkpointSandbox
// was written from and tested against (Debian's 20221219, which HOSTS.md measured). The call
// is runsc's internal protocol, not a published API: another build is checkpointed by `runsc
// checkpoint`, as before, rather than sent a call it may read differently.
const directCheckpointBuild = "20221219"

// runscBuildKnown answers whether `runsc --version` printed version (its first line, "runsc
// version 0.0~20221219.0") of directCheckpointBuild.
func runscBuildKnown(version []byte) bool {
	first, _, _ := bytes.Cut(version, []byte("\n"))
	v, ok := bytes.CutPrefix(bytes.TrimSpace(first), []byte("runsc version "))
	return ok && bytes.Contains(v, []byte(directCheckpointBuild))
}

// errNoDirectCheckpoint: the sandbox could not be asked directly; nothing was saved.
var errNoDirectCheckpoint = errors.New("oci: no direct checkpoint")

// checkpointSandbox is runsc's own checkpoint call (runsc/sandbox Checkpoint): the method
// containerManager.Checkpoint with the image file passed beside it (urpc: one JSON object on
// the sandbox's control socket, the file descriptors in its first write), answered by one
// JSON object. The control socket is the abstract Unix socket "runsc-sandbox.ID" (the root
// container's sandbox has the container's id), whose name runsc (20221219) binds with a
// trailing NUL; both spellings are tried.
func checkpointSandbox(ctx context.Context, id, img string) error {
	var conn *net.UnixConn
	var dialErr error
	for _, name := range []string{"@runsc-sandbox." + id + "\x00", "@runsc-sandbox." + id} {
		if conn, dialErr = net.DialUnix("unix", nil, &net.UnixAddr{Name: name, Net: "unix"}); dialErr == nil {
			break
		}
	}
	if dialErr != nil {
		return fmt.Errorf("%w: %w", errNoDirectCheckpoint, dialErr)
	}
	defer conn.Close()
	f, err := os.OpenFile(filepath.Join(img, runscImageFile), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	call, err := json.Marshal(struct {
		Method string   `json:"method"`
		Arg    struct{} `json:"arg"` // control.SaveOpts, all defaults: runsc checkpoint's own
	}{Method: "containerManager.Checkpoint"})
	if err != nil {
		return err
	}
	// The save goes on in the sandbox whatever happens here (as it does when runsc
	// checkpoint is killed); a cancelled ctx stops the wait for its answer. A ctx that has
	// already ended asks nothing, as runsc checkpoint's process is then not started: the
	// save would stop the guest that the caller is told was not checkpointed.
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	if _, _, err := conn.WriteMsgUnix(call, syscall.UnixRights(int(f.Fd())), nil); err != nil {
		return ctxOr(ctx, fmt.Errorf("send the checkpoint call: %w", err))
	}
	var res struct {
		Success bool   `json:"success"`
		Err     string `json:"err"`
	}
	// Bounded: the sandbox runs what the guest runs. runsc's longest answer seen, a refused
	// save's dump and stacks, was tens of kB.
	const mostAnswer = 1 << 20
	if err := json.NewDecoder(io.LimitReader(conn, mostAnswer)).Decode(&res); err != nil {
		return ctxOr(ctx, fmt.Errorf("the sandbox's answer to its checkpoint (read up to %d bytes): %w", mostAnswer, err))
	}
	if !res.Success {
		if res.Err == "unknown method" { // urpc.ErrUnknownMethod: nothing was done
			return fmt.Errorf("%w: the sandbox does not know containerManager.Checkpoint", errNoDirectCheckpoint)
		}
		// runsc checkpoint's own words for it, which callers and logs look for.
		return fmt.Errorf("checkpoint failed: %s", saveFailure(res.Err))
	}
	return nil
}

// ctxOr is ctx's error, when it has one, with err; else err.
func ctxOr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return err
}

// saveFailure is the sandbox's account of a save it could not make, as a person can read it
// and the tenant is shown it: runsc 20221219 dumps the object it could not save whole (13 kB
// for a TCP endpoint) and the goroutine stacks of its panic after it. Kept: the first line,
// the object's type, the TCP port it had, and the reason; a TCP endpoint with waiters (a guest
// process's event loop on a socket, which gVisor cannot save) says what to do about it.
func saveFailure(msg string) string {
	msg, _, _ = strings.Cut(msg, "\n")
	msg = strings.TrimSuffix(strings.TrimSpace(msg), ":")
	pre, rest, ok := strings.Cut(msg, "encoding error at object ")
	if !ok {
		return clipSaveFailure(msg)
	}
	typ, dump, ok := strings.Cut(rest, "{")
	i := strings.LastIndex(dump, "}: ")
	if !ok || i < 0 {
		return clipSaveFailure(msg)
	}
	what := typ
	if m := localPort.FindStringSubmatch(dump[:i]); m != nil {
		if port, err := strconv.ParseUint(m[1], 16, 16); err == nil && port != 0 {
			what += fmt.Sprintf(" (local port %d)", port)
		}
	}
	reason := dump[i+len("}: "):]
	msg = pre + "encoding error at object " + what + ": " + reason
	if typ == "tcp.endpoint" && strings.Contains(reason, "has waiters") {
		msg += "; gVisor cannot save a TCP socket that a guest process waits on in epoll, poll or select (a server's event loop): " +
			"stop that process or close the socket before a memory snapshot, or take the snapshot without memory"
	}
	return clipSaveFailure(msg)
}

// localPort finds a TCP endpoint's local port in runsc's dump of it.
var localPort = regexp.MustCompile(`LocalPort:0x([0-9a-f]{1,4})\b`)

// clipSaveFailure bounds what the sandbox's answer puts in an error.
func clipSaveFailure(msg string) string {
	const most = 1024
	if len(msg) <= most {
		return msg
	}
	return strings.ToValidUTF8(msg[:most], "") + "…"
}
