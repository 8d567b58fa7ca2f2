package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"time"
)

// RelayCommand is the hidden subcommand of `wb agent` that Start runs Chromium under.
const RelayCommand = "cdp-relay"

// relaySocket is the abstract Unix socket the relay serves DevTools on. Not TCP: this gVisor
// cannot checkpoint a TCP listener that a process waits on, and a desktop's sleep is a
// checkpoint; not a socket file either (one bound on the disk cannot be checkpointed).
const relaySocket = "@wb-desktop-devtools"

// maxCDPMessage bounds one DevTools message either way.
const maxCDPMessage = 2*MaxResultBytes + 64<<10

// claimSpareMethod is the one method the relay answers itself: it hands the client the spare
// (a *spare), or answers an error when none is ready. Chromium never sees it.
const claimSpareMethod = "WB.claimSpare"

// relayIDBase starts the ids of the relay's own calls to Chromium: clients' ids are below it
// (dialBrowser), and Chromium wants ids that fit an int32.
const relayIDBase = 1 << 30

// spareTimeout bounds the making of one spare.
const spareTimeout = time.Minute

// spare is a browser context with one blank page, attached (on the relay's connection, which
// every client shares) and with its renderer answering: what a run_js call would otherwise
// spend most of its time on (a new renderer, about 2 s under gVisor). The relay makes one
// between clients; a client claims it, and the relay disposes of it once that client leaves.
type spare struct {
	ContextID string `json:"browserContextId"`
	TargetID  string `json:"targetId"`
	SessionID string `json:"sessionId"`
}

// RelayMain is `wb agent cdp-relay CHROMIUM [ARG…]`: it runs Chromium with
// --remote-debugging-pipe (DevTools on fds 3 and 4, NUL-terminated JSON) and serves that
// pipe on relaySocket to one client at a time, passing whole messages both ways (what
// Chromium says while no client is connected is dropped). Clients pick their own message ids
// at random, so a late answer meant for an earlier client is ignored by the next. Between
// clients it keeps a spare browser context ready (claimSpareMethod). It exits with Chromium.
func RelayMain(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: wb agent " + RelayCommand + " CHROMIUM [ARG…]")
	}
	ln, err := net.Listen("unix", relaySocket)
	if err != nil {
		return fmt.Errorf("listen on %s (is a relay already running?): %w", relaySocket, err)
	}
	defer ln.Close()
	return serveRelay(ctx, ln, append(args, "--remote-debugging-pipe"), slog.New(slog.NewTextHandler(os.Stderr, nil)))
}

// relay is RelayMain's state: the browser's pipe, the connected client, and its own calls.
type relay struct {
	log *slog.Logger

	wmu       sync.Mutex // one writer of the pipe at a time: a message is written whole
	toBrowser io.Writer

	mu      sync.Mutex
	current net.Conn
	pending map[int64]chan cdpMessage // the relay's own calls, by id
	nextID  int64
	spare   *spare        // ready to claim
	making  chan struct{} // closed when the spare being made is ready or failed; nil if none is
	claimed []string      // contexts claimed by the current client, to dispose of once it leaves
	kick    chan struct{}
}

// serveRelay runs browser (argv) with DevTools on fds 3 and 4 and serves them on ln until
// the browser exits.
func serveRelay(ctx context.Context, ln net.Listener, browser []string, log *slog.Logger) error {
	toBrowserR, toBrowserW, err := os.Pipe()
	if err != nil {
		return err
	}
	fromBrowserR, fromBrowserW, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, browser[0], browser[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{toBrowserR, fromBrowserW} // fds 3 and 4
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", browser[0], err)
	}
	_, _ = toBrowserR.Close(), fromBrowserW.Close()

	r := &relay{log: log, toBrowser: toBrowserW, pending: map[int64]chan cdpMessage{},
		nextID: relayIDBase, kick: make(chan struct{}, 1)}
	go r.fromBrowser(bufio.NewReaderSize(fromBrowserR, 64<<10))
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go r.keepSpare(rctx)
	r.kick <- struct{}{}

	exited := make(chan error, 1)
	go func() {
		exited <- cmd.Wait()
		_ = ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return <-exited
		}
		r.serve(c)
	}
}

// fromBrowser passes each of Chromium's messages to the relay's own call it answers, or to
// the current client.
func (r *relay) fromBrowser(br *bufio.Reader) {
	for {
		msg, err := readMessage(br, maxCDPMessage)
		if err != nil && !errors.Is(err, errTooLong) {
			return
		}
		if err != nil {
			continue
		}
		var head struct {
			ID int64 `json:"id"`
		}
		if json.Unmarshal(msg[:len(msg)-1], &head) == nil && head.ID >= relayIDBase {
			r.mu.Lock()
			ch := r.pending[head.ID]
			delete(r.pending, head.ID)
			r.mu.Unlock()
			var m cdpMessage
			if ch != nil && json.Unmarshal(msg[:len(msg)-1], &m) == nil {
				ch <- m
			}
			continue
		}
		r.mu.Lock()
		r.toClient(msg)
		r.mu.Unlock()
	}
}

// toClient writes msg to the current client, if any. The caller holds r.mu.
func (r *relay) toClient(msg []byte) {
	if c := r.current; c != nil {
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(msg); err != nil {
			_ = c.Close()
		}
	}
}

func (r *relay) write(msg []byte) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	_, err := r.toBrowser.Write(msg)
	return err
}

// serve passes client c's messages to Chromium until it leaves, answering claimSpareMethod
// itself, then has the spare renewed.
func (r *relay) serve(c net.Conn) {
	r.mu.Lock()
	r.current = c
	r.mu.Unlock()
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		msg, err := readMessage(br, maxCDPMessage)
		if err != nil {
			break // only whole messages reach Chromium
		}
		var head struct {
			ID     int64  `json:"id"`
			Method string `json:"method"`
		}
		if json.Unmarshal(msg[:len(msg)-1], &head) == nil && head.Method == claimSpareMethod {
			r.claim(head.ID)
			continue
		}
		if err := r.write(msg); err != nil {
			break
		}
	}
	r.mu.Lock()
	r.current = nil
	r.mu.Unlock()
	_ = c.Close()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// claim answers call id of the current client with the spare, which is then the client's.
// While one is being made, it waits for it: making a second at the same time would double
// the wait (both renderers starting on the same cores).
func (r *relay) claim(id int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.spare == nil && r.making != nil {
		making := r.making
		r.mu.Unlock()
		<-making // keepSpare's making is bounded by spareTimeout
		r.mu.Lock()
	}
	answer := map[string]any{"id": id}
	if s := r.spare; s != nil {
		r.spare = nil
		r.claimed = append(r.claimed, s.ContextID)
		answer["result"] = s
	} else {
		answer["error"] = map[string]any{"code": -32000, "message": "no spare browser context is ready"}
	}
	b, _ := json.Marshal(answer)
	r.toClient(append(b, 0))
}

// keepSpare disposes of the contexts that clients claimed and makes a new spare, each time
// it is kicked (at start, and when a client leaves).
func (r *relay) keepSpare(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		r.mu.Lock()
		claimed, ready := r.claimed, r.spare != nil
		r.claimed = nil
		var making chan struct{}
		if !ready {
			making = make(chan struct{})
			r.making = making
		}
		r.mu.Unlock()
		for _, id := range claimed {
			if err := disposeContext(ctx, r.call, id); err != nil {
				r.log.Warn("relay: dispose of a claimed browser context", "err", err)
			}
		}
		if ready {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, spareTimeout)
		s, err := newContext(sctx, r.call)
		cancel()
		if err != nil {
			// The next client makes its own; its leaving tries again.
			r.log.Warn("relay: make a spare browser context", "err", err)
		}
		r.mu.Lock()
		r.spare, r.making = s, nil
		close(making)
		r.mu.Unlock()
	}
}

// call is the relay's own DevTools call.
func (r *relay) call(ctx context.Context, session, method string, params, result any) error {
	ch := make(chan cdpMessage, 1)
	r.mu.Lock()
	r.nextID++
	id := r.nextID
	r.pending[id] = ch
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.pending, id)
		r.mu.Unlock()
	}()
	b, err := json.Marshal(cdpMessage{ID: id, Method: method, SessionID: session, Params: params})
	if err != nil {
		return err
	}
	if err := r.write(append(b, 0)); err != nil {
		return fmt.Errorf("devtools %s: %w", method, err)
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("devtools %s: %w", method, ctx.Err())
	case m := <-ch:
		return m.result(method, result)
	}
}

// callFunc is a DevTools call: the relay's own, or a client's (cdpConn.call).
type callFunc func(ctx context.Context, session, method string, params, result any) error

// newContext makes a browser context with one blank page, attaches to it, and waits until
// the page's renderer answers (a script's time must not include the renderer's start).
func newContext(ctx context.Context, call callFunc) (*spare, error) {
	var s spare
	if err := call(ctx, "", "Target.createBrowserContext", map[string]any{"disposeOnDetach": true}, &s); err != nil {
		return nil, err
	}
	var tg struct {
		ID string `json:"targetId"`
	}
	err := call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank", "browserContextId": s.ContextID, "hidden": true}, &tg)
	if err == nil {
		s.TargetID = tg.ID
		err = call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": tg.ID, "flatten": true}, &s)
	}
	if err == nil {
		err = call(ctx, s.SessionID, "Runtime.evaluate", map[string]any{"expression": "0"}, nil)
	}
	if err != nil {
		_ = disposeContext(ctx, call, s.ContextID)
		return nil, err
	}
	return &s, nil
}

// disposeContext disposes of browser context id, within a deadline of its own: a context goes
// even when the caller's time ran out.
func disposeContext(ctx context.Context, call callFunc, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return call(ctx, "", "Target.disposeBrowserContext", map[string]any{"browserContextId": id}, nil)
}

var errTooLong = errors.New("devtools message too long")

// readMessage reads one NUL-terminated message (NUL included) of at most limit bytes; a
// longer one is skipped whole and answered errTooLong.
func readMessage(br *bufio.Reader, limit int) ([]byte, error) {
	var msg []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice(0)
		if !tooLong {
			if len(msg)+len(chunk) > limit {
				tooLong, msg = true, nil
			} else {
				msg = append(msg, chunk...)
			}
		}
		switch {
		case err == nil && tooLong:
			return nil, errTooLong
		case err == nil:
			return msg, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(msg) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
