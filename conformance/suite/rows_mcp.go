package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"wb/client"
	"wb/desktop"
)

// The rows of seed 001's "Session lifecycle" table, column "What an MCP call does": an MCP
// client (the official Go SDK, over the wb SDK's MCPHTTPClient, which carries the key) calls
// a desktop's tools in each state. The gateway answers a call its desktop's state refuses
// with a JSON-RPC error whose code is the HTTP status.

// mcpCommand is the tool call each step makes: run_command answers the exec result as JSON.
const mcpCommand = "echo hi"

// mcpSession connects an MCP client to the desktop's mcp_url (the connect is MCP's
// initialize).
func (e *Env) mcpSession(ctx context.Context, d *client.Desktop) (*mcp.ClientSession, error) {
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "wb-conformance", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: d.MCPURL, HTTPClient: e.C.MCPHTTPClient(), MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("MCP initialize at %s: %w", d.MCPURL, err)
	}
	return cs, nil
}

// mcpOutcome is how one tool call ended: its exec result, or the JSON-RPC error a refusal
// is, or another error (transport, tool error).
type mcpOutcome struct {
	res    client.ExecResult
	rpc    *jsonrpc.Error
	err    error
	took   time.Duration
	state  desktop.State // the desktop's state just before the call
	noRoom int           // the tries answered 409 no_capacity before this answer
}

// tries says how many tries were refused for want of room, if any.
func (o mcpOutcome) tries() string {
	if o.noRoom == 0 {
		return ""
	}
	return fmt.Sprintf(" (after %d tries answered 409 no_capacity)", o.noRoom)
}

// runCommand calls run_command with command on cs, noting the desktop's state just before.
func (e *Env) runCommand(ctx context.Context, cs *mcp.ClientSession, id, command string) mcpOutcome {
	var o mcpOutcome
	if d, err := e.C.GetDesktop(ctx, id); err == nil {
		o.state = d.State
	}
	start := time.Now()
	var res *mcp.CallToolResult
	var err error
	// A call that would wake the desktop answers 409 no_capacity while no machine has room:
	// try it again, as a client would.
	_ = retryNoRoom(ctx, func() bool {
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": command}})
		var rpc *jsonrpc.Error
		if errors.As(err, &rpc) && rpc.Code == 409 && strings.Contains(rpc.Message, "no_capacity") {
			o.noRoom++
			return true
		}
		return false
	})
	o.took = time.Since(start)
	switch {
	case errors.As(err, &o.rpc):
	case err != nil:
		o.err = fmt.Errorf("run_command: %w", err)
	case res.IsError:
		o.err = fmt.Errorf("run_command: a tool error: %s", toolText(res))
	default:
		if jerr := json.Unmarshal([]byte(toolText(res)), &o.res); jerr != nil {
			o.err = fmt.Errorf("run_command answered %q: %w", toolText(res), jerr)
		}
	}
	return o
}

// answered checks that the call ran mcpCommand and answers what it saw.
func (o mcpOutcome) answered() (string, error) {
	switch {
	case o.rpc != nil:
		return fmt.Sprintf("call made while %s → JSON-RPC error %d %q", o.state, o.rpc.Code, o.rpc.Message), errors.New("want the call answered")
	case o.err != nil:
		return fmt.Sprintf("call made while %s", o.state), o.err
	}
	saw := fmt.Sprintf("call made while %s answered stdout %q exit %d in %s%s", o.state, o.res.Stdout, o.res.ExitCode, o.took.Round(100*time.Millisecond), o.tries())
	if o.res.Stdout != "hi\n" || o.res.ExitCode != 0 {
		return saw, fmt.Errorf("want stdout %q, exit 0", "hi\n")
	}
	return saw, nil
}

// refused checks that the call was refused with a JSON-RPC error of code status whose
// message names the desktop's state word (and, when set, contains also).
func (o mcpOutcome) refused(status int64, word, also string) (string, error) {
	switch {
	case o.err != nil:
		return fmt.Sprintf("call made while %s", o.state), o.err
	case o.rpc == nil:
		return fmt.Sprintf("call made while %s answered stdout %q", o.state, o.res.Stdout), fmt.Errorf("want a JSON-RPC error %d", status)
	}
	saw := fmt.Sprintf("call made while %s → JSON-RPC error %d %q", o.state, o.rpc.Code, o.rpc.Message)
	if o.rpc.Code != status || !strings.Contains(o.rpc.Message, word) || !strings.Contains(o.rpc.Message, also) {
		return saw, fmt.Errorf("want code %d naming the state %s", status, word)
	}
	return saw, nil
}

func toolText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// mcpLife walks one desktop through starting, running, stopping (to asleep), asleep,
// stopping (to stopped) and stopped, making a tool call in each; each step's outcome is
// kept for its row. A step that fails ends the walk.
func mcpLife(ctx context.Context, e *Env) (*desktopFixture, error) {
	return shared(ctx, e, "mcp", func(ctx context.Context, e *Env) (*desktopFixture, error) {
		f := &desktopFixture{steps: map[string]step{}}
		d, err := e.CreateDesktop(ctx, "conformance mcp "+e.Tag())
		if err != nil {
			return nil, err
		}
		id := d.ID
		cs, err := e.mcpSession(ctx, d)
		if err != nil {
			return nil, err
		}
		defer cs.Close()
		// do runs one step; a step that fails ends the walk.
		do := func(name string, run func() (string, error)) {
			if f.broken != "" {
				return
			}
			saw, err := run()
			f.steps[name] = step{saw: saw, err: err}
			if err != nil {
				f.broken = name
			}
		}
		// after answers the desktop's state once a call has returned, wanting want.
		after := func(saw string, err error, want desktop.State) (string, error) {
			got, gerr := e.C.GetDesktop(ctx, id)
			if gerr != nil {
				return saw, errors.Join(err, gerr)
			}
			saw += fmt.Sprintf("; then %s", got.State)
			if err == nil && got.State != want {
				err = fmt.Errorf("want the desktop %s after the call", want)
			}
			return saw, err
		}
		// during checks that a call was made in the state it is about: a state that ended
		// before the call could be made checked nothing.
		during := func(o mcpOutcome, state desktop.State, saw string, err error) (string, error) {
			if err == nil && o.state != state {
				err = fmt.Errorf("the desktop was %s, not %s, when the call was made: not checked", o.state, state)
			}
			return saw, err
		}
		do("starting", func() (string, error) {
			o := e.runCommand(ctx, cs, id, mcpCommand)
			saw, err := o.answered()
			saw, err = during(o, desktop.Starting, saw, err)
			return after("create answered "+string(d.State)+"; "+saw, err, desktop.Running)
		})
		do("running", func() (string, error) {
			o := e.runCommand(ctx, cs, id, mcpCommand)
			saw, err := o.answered()
			saw, err = during(o, desktop.Running, saw, err)
			return after(saw, err, desktop.Running)
		})
		do("stopping to asleep", func() (string, error) {
			ans, err := e.C.SleepDesktop(ctx, id)
			if err != nil {
				return "", fmt.Errorf("sleep: %w", err)
			}
			o := e.runCommand(ctx, cs, id, mcpCommand)
			saw, err := o.answered()
			saw, err = during(o, desktop.Stopping, saw, err)
			return after(":sleep answered "+string(ans.State)+"; "+saw, err, desktop.Running)
		})
		do("asleep", func() (string, error) {
			if _, err := e.C.SleepDesktop(ctx, id); err != nil {
				return "", fmt.Errorf("sleep: %w", err)
			}
			asleep, _, err := e.waitDesktop(ctx, id, desktop.Asleep)
			if err != nil {
				return "", err
			}
			// A fresh client: its initialize, then tools/list, touch nothing.
			cs2, err := e.mcpSession(ctx, asleep)
			if err != nil {
				return "", err
			}
			defer cs2.Close()
			tools, err := cs2.ListTools(ctx, nil)
			if err != nil {
				return "", fmt.Errorf("tools/list: %w", err)
			}
			still, err := e.C.GetDesktop(ctx, id)
			if err != nil {
				return "", err
			}
			saw := fmt.Sprintf("initialize and tools/list (%d tools): still %s, last_used_at %s", len(tools.Tools), still.State, sameTime(asleep.LastUsedAt, still.LastUsedAt))
			if still.State != desktop.Asleep || !equalTime(asleep.LastUsedAt, still.LastUsedAt) {
				return saw, errors.New("want initialize and tools/list to leave the desktop asleep and unused")
			}
			// The call, watched: the states the desktop passes through while it wakes.
			watch, stop := context.WithCancel(ctx)
			defer stop()
			seenc := make(chan []desktop.State, 1)
			go func() {
				_, seen, _ := e.waitDesktop(watch, id, desktop.Running)
				seenc <- seen
			}()
			o := e.runCommand(ctx, cs2, id, mcpCommand)
			if o.err != nil || o.rpc != nil {
				stop()
			}
			seen := <-seenc
			called, err := o.answered()
			saw += "; " + called + "; states " + joinDesktopStates(seen)
			// The transition the call caused, for its row of "Transitions".
			wake := step{saw: "states while the call ran: " + joinDesktopStates(seen), err: err}
			switch {
			case err != nil:
			case len(seen) == 0 || seen[len(seen)-1] != desktop.Running:
				wake.err = errors.New("want the desktop running once the call answered")
			case !slices.Contains(seen, desktop.Starting):
				wake.saw += " (starting shorter than a poll)"
			}
			if slices.ContainsFunc(seen, func(s desktop.State) bool {
				return s != desktop.Asleep && s != desktop.Starting && s != desktop.Running
			}) && wake.err == nil {
				wake.err = errors.New("want asleep, starting, then running")
			}
			f.steps["mcp wake"] = wake
			saw, err = during(o, desktop.Asleep, saw, err)
			return after(saw, err, desktop.Running)
		})
		do("stopping to stopped", func() (string, error) {
			ans, err := e.C.StopDesktop(ctx, id)
			if err != nil {
				return "", fmt.Errorf("stop: %w", err)
			}
			o := e.runCommand(ctx, cs, id, mcpCommand)
			saw, err := o.refused(409, "stopping", "")
			saw, err = during(o, desktop.Stopping, saw, err)
			return ":stop answered " + string(ans.State) + "; " + saw, err
		})
		do("stopped", func() (string, error) {
			if _, _, err := e.waitDesktop(ctx, id, desktop.Stopped); err != nil {
				return "", err
			}
			o := e.runCommand(ctx, cs, id, mcpCommand)
			saw, err := o.refused(409, "stopped", "")
			saw, err = during(o, desktop.Stopped, saw, err)
			return after(saw, err, desktop.Stopped)
		})
		if _, err := e.C.DeleteDesktop(ctx, id); err != nil && apiStatus(err) != 404 {
			return f, fmt.Errorf("delete the desktop: %w", err)
		}
		return f, nil
	})
}

func equalTime(a, b *client.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b.Time)
}

func sameTime(a, b *client.Time) string {
	if equalTime(a, b) {
		return "unchanged"
	}
	return fmt.Sprintf("%v → %v", a, b)
}

func mcpRows() []Row {
	const lt = "Session lifecycle"
	row := func(table, name, stepName string) Row {
		return Row{Seed: "001", Table: table, Row: name, Timeout: func(Timers) time.Duration { return 10 * time.Minute },
			Check: func(ctx context.Context, e *Env) (string, error) {
				f, err := mcpLife(ctx, e)
				if err != nil {
					return "", err
				}
				return f.get(stepName)
			}}
	}
	stopping := row(lt, "stopping | MCP call: Depends on what it becomes (to asleep: wakes it and answers; to stopped: 409)", "")
	stopping.Check = func(ctx context.Context, e *Env) (string, error) {
		f, err := mcpLife(ctx, e)
		if err != nil {
			return "", err
		}
		var failed []string
		part := func(name string) string {
			saw, err := f.get(name)
			if err != nil {
				failed = append(failed, name)
				saw = strings.TrimPrefix(saw+"; "+err.Error(), "; ")
			}
			return name + ": " + saw
		}
		saw := part("stopping to asleep") + " | " + part("stopping to stopped")
		if len(failed) > 0 {
			return saw, fmt.Errorf("failed: %s", strings.Join(failed, ", "))
		}
		return saw, nil
	}
	return []Row{
		row(lt, "starting | MCP call: Waits until it runs, then answers", "starting"),
		row(lt, "running | MCP call: Answers", "running"),
		stopping,
		row(lt, "asleep | MCP call: Wakes it, waits, then answers (initialize and tools/list leave it asleep)", "asleep"),
		row(lt, "stopped | MCP call: Fails with 409 (it stays stopped)", "stopped"),
		{Seed: "001", Table: lt, Row: "failed | MCP call: Fails with 502 (a desktop created under a reached spend cap)", Serial: true,
			Timeout: spendCapTimeout, Check: func(ctx context.Context, e *Env) (string, error) {
				f, err := spendCapped(ctx, e)
				if err != nil {
					return "", err
				}
				if f.deskErr != nil {
					return f.deskSaw, f.deskErr
				}
				saw, err := f.deskCall.refused(502, "failed", f.desk.Message)
				saw = f.deskSaw + "; " + saw + "; then " + string(f.deskAfter)
				if err == nil && f.deskAfter != desktop.Failed {
					err = errors.New("want the desktop still failed after the call")
				}
				return saw, err
			}},
		row("Transitions", "asleep | An MCP call | starting, then running", "mcp wake"),
	}
}
