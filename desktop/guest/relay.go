package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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

// RelayMain is `wb agent cdp-relay CHROMIUM [ARG…]`: it runs Chromium with
// --remote-debugging-pipe (DevTools on fds 3 and 4, NUL-terminated JSON) and serves that
// pipe on relaySocket to one client at a time, passing whole messages both ways (what
// Chromium says while no client is connected is dropped). Clients pick their own message ids
// at random, so a late answer meant for an earlier client is ignored by the next. It exits
// with Chromium.
func RelayMain(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: wb agent " + RelayCommand + " CHROMIUM [ARG…]")
	}
	toBrowserR, toBrowserW, err := os.Pipe()
	if err != nil {
		return err
	}
	fromBrowserR, fromBrowserW, err := os.Pipe()
	if err != nil {
		return err
	}
	ln, err := net.Listen("unix", relaySocket)
	if err != nil {
		return fmt.Errorf("listen on %s (is a relay already running?): %w", relaySocket, err)
	}
	defer ln.Close()
	cmd := exec.CommandContext(ctx, args[0], append(args[1:], "--remote-debugging-pipe")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{toBrowserR, fromBrowserW} // fds 3 and 4
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", args[0], err)
	}
	_, _ = toBrowserR.Close(), fromBrowserW.Close()

	var mu sync.Mutex
	var current net.Conn
	go func() { // Chromium → the current client
		br := bufio.NewReaderSize(fromBrowserR, 64<<10)
		for {
			msg, err := readMessage(br, maxCDPMessage)
			if err != nil && !errors.Is(err, errTooLong) {
				return
			}
			mu.Lock()
			if c := current; c != nil && err == nil {
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, werr := c.Write(msg); werr != nil {
					_ = c.Close()
				}
			}
			mu.Unlock()
		}
	}()
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
		mu.Lock()
		current = c
		mu.Unlock()
		br := bufio.NewReaderSize(c, 64<<10)
		for {
			msg, err := readMessage(br, maxCDPMessage)
			if err != nil {
				break // only whole messages reach Chromium
			}
			if _, err := toBrowserW.Write(msg); err != nil {
				break
			}
		}
		mu.Lock()
		current = nil
		mu.Unlock()
		_ = c.Close()
	}
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
