package suite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"wb/client"
	"wb/desktop"
)

// step is what one step of the desktop's life showed.
type step struct {
	saw string
	err error
}

// desktopFixture walks one desktop through its life (seed 001, "Transitions"), each step's
// outcome kept for its row: create, sleep, wake, stop, start, sleep then stop, delete. A
// step that fails ends the walk; the rows of the steps after it fail naming it.
type desktopFixture struct {
	steps  map[string]step
	broken string // the step that ended the walk early
}

func (f *desktopFixture) get(name string) (string, error) {
	if s, ok := f.steps[name]; ok {
		return s.saw, s.err
	}
	return "", fmt.Errorf("not reached: the step %q failed first", f.broken)
}

// waitDesktop polls the desktop until it is in one of states; failed (unless asked for) ends
// the wait with its message.
func (e *Env) waitDesktop(ctx context.Context, id string, states ...desktop.State) (*client.Desktop, []desktop.State, error) {
	var last *client.Desktop
	var seen []desktop.State
	err := poll(ctx, func() (bool, error) {
		d, err := e.C.GetDesktop(ctx, id)
		if err != nil {
			return false, err
		}
		last = d
		if len(seen) == 0 || seen[len(seen)-1] != d.State {
			seen = append(seen, d.State)
		}
		for _, s := range states {
			if d.State == s {
				return true, nil
			}
		}
		if d.State == desktop.Failed {
			return false, fmt.Errorf("desktop %s failed: %s", id, d.Message)
		}
		return false, nil
	})
	if err != nil && last != nil && ctx.Err() != nil {
		err = fmt.Errorf("desktop %s still %s, not %v: %w", id, last.State, states, err)
	}
	return last, seen, err
}

func joinDesktopStates(ss []desktop.State) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return strings.Join(out, " → ")
}

func desktopLife(ctx context.Context, e *Env) (*desktopFixture, error) {
	return shared(ctx, e, "desktop", func(ctx context.Context, e *Env) (*desktopFixture, error) {
		f := &desktopFixture{steps: map[string]step{}}
		d, err := e.CreateDesktop(ctx, "conformance "+e.Tag())
		if err != nil {
			return nil, err
		}
		id := d.ID
		// do runs one step: act answers the desktop as the action answered it, then the step
		// waits for want and checks what it saw.
		do := func(name string, act func() (*client.Desktop, error), want desktop.State, check func(answer, got *client.Desktop, seen []desktop.State) (string, error)) bool {
			if f.broken != "" {
				return false
			}
			start := time.Now()
			answer, err := act()
			if err != nil {
				f.steps[name] = step{err: fmt.Errorf("%s: %w", name, err)}
				f.broken = name
				return false
			}
			got, seen, err := e.waitDesktop(ctx, id, want)
			if err != nil {
				f.steps[name] = step{saw: "states " + joinDesktopStates(seen), err: err}
				f.broken = name
				return false
			}
			saw, err := check(answer, got, seen)
			saw = fmt.Sprintf("%s answered %s; %s in %s; %s", name, answer.State, joinDesktopStates(seen), time.Since(start).Round(100*time.Millisecond), saw)
			f.steps[name] = step{saw: saw, err: err}
			if err != nil {
				f.broken = name
			}
			return err == nil
		}
		mark := func(got *client.Desktop) (string, error) {
			// Disk and a process, to see what each of sleep and stop keeps.
			if got.SessionID == "" {
				return "", errors.New("a running desktop shows no session_id")
			}
			_, err := e.Sh(ctx, got.SessionID, `echo kept > /workspace/desk; sleep 525252 >/dev/null 2>&1 &`)
			return "session " + got.SessionID, err
		}
		kept := func(got *client.Desktop) (disk, process bool, err error) {
			out, err := e.Sh(ctx, got.SessionID, "cat /workspace/desk 2>/dev/null; ps -o args 2>/dev/null || ps")
			return strings.HasPrefix(out, "kept"), strings.Contains(out, "sleep 525252"), err
		}
		var stateSaved bool
		do("create", func() (*client.Desktop, error) { return d, nil }, desktop.Running, func(answer, got *client.Desktop, _ []desktop.State) (string, error) {
			s, err := mark(got)
			if answer.State != desktop.Starting && answer.State != desktop.Running {
				return s, errors.New("want the create answered starting")
			}
			return s, err
		})
		do("sleep", func() (*client.Desktop, error) { return e.C.SleepDesktop(ctx, id) }, desktop.Asleep, func(_, got *client.Desktop, seen []desktop.State) (string, error) {
			stateSaved = got.StateSaved
			saw := fmt.Sprintf("state_saved %v", got.StateSaved)
			if !got.StateSaved {
				saw += fmt.Sprintf(" (asleep: state not saved: %s)", got.Message)
			}
			if got.SessionID != "" {
				return saw, errors.New("an asleep desktop still shows a session")
			}
			return saw, nil
		})
		do("wake", func() (*client.Desktop, error) {
			return withRoom(ctx, func() (*client.Desktop, error) { return e.C.WakeDesktop(ctx, id) })
		}, desktop.Running, func(_, got *client.Desktop, _ []desktop.State) (string, error) {
			disk, process, err := kept(got)
			saw := fmt.Sprintf("disk kept %v, process kept %v (state_saved was %v)", disk, process, stateSaved)
			switch {
			case err != nil:
				return saw, err
			case !disk:
				return saw, errors.New("the disk was not kept across sleep")
			case stateSaved && !process:
				return saw, errors.New("state_saved, yet the process is gone after the wake")
			case !stateSaved && process:
				return saw, errors.New("state not saved, yet the process came back")
			}
			return saw, nil
		})
		do("stop", func() (*client.Desktop, error) { return e.C.StopDesktop(ctx, id) }, desktop.Stopped, func(_, got *client.Desktop, _ []desktop.State) (string, error) {
			return fmt.Sprintf("state_saved %v", got.StateSaved), nil
		})
		do("start", func() (*client.Desktop, error) {
			return withRoom(ctx, func() (*client.Desktop, error) { return e.C.StartDesktop(ctx, id) })
		}, desktop.Running, func(_, got *client.Desktop, _ []desktop.State) (string, error) {
			disk, process, err := kept(got)
			saw := fmt.Sprintf("disk kept %v, process kept %v", disk, process)
			switch {
			case err != nil:
				return saw, err
			case !disk:
				return saw, errors.New("the disk was not kept across stop")
			case process:
				return saw, errors.New("a process survived a stop: want a fresh start from the disk")
			}
			_, err = mark(got)
			return saw, err
		})
		do("asleep stop", func() (*client.Desktop, error) {
			if _, err := e.C.SleepDesktop(ctx, id); err != nil {
				return nil, err
			}
			if _, _, err := e.waitDesktop(ctx, id, desktop.Asleep); err != nil {
				return nil, err
			}
			return e.C.StopDesktop(ctx, id)
		}, desktop.Stopped, func(_, got *client.Desktop, _ []desktop.State) (string, error) {
			saw := fmt.Sprintf("state_saved %v", got.StateSaved)
			if got.StateSaved {
				return saw, errors.New("the saved state was kept through a stop")
			}
			if _, err := withRoom(ctx, func() (*client.Desktop, error) { return e.C.StartDesktop(ctx, id) }); err != nil {
				return saw, fmt.Errorf("start after the stop: %w", err)
			}
			again, _, err := e.waitDesktop(ctx, id, desktop.Running)
			if err != nil {
				return saw, err
			}
			disk, process, err := kept(again)
			saw += fmt.Sprintf("; started again: disk kept %v, process kept %v", disk, process)
			if err == nil && (process || !disk) {
				err = errors.New("want the disk without the process: the snapshot discarded")
			}
			return saw, err
		})
		if f.broken == "" {
			_, err := e.C.DeleteDesktop(ctx, id)
			var getErr error
			if err == nil {
				getErr = poll(ctx, func() (bool, error) {
					_, err := e.C.GetDesktop(ctx, id)
					if apiStatus(err) == 404 {
						return true, nil
					}
					return false, err
				})
			}
			f.steps["delete"] = step{saw: fmt.Sprintf("DELETE → %s; GET → 404 %v", statusOf(err), getErr == nil), err: errors.Join(err, getErr)}
		}
		return f, nil
	})
}

func desktopRows() []Row {
	const tt = "Transitions"
	row := func(table, name, stepName string) Row {
		return Row{Seed: "001", Table: table, Row: name, Timeout: func(Timers) time.Duration { return 8 * time.Minute },
			Check: func(ctx context.Context, e *Env) (string, error) {
				f, err := desktopLife(ctx, e)
				if err != nil {
					return "", err
				}
				return f.get(stepName)
			}}
	}
	return []Row{
		row(tt, "(none) | Create | starting, then running", "create"),
		row(tt, "running | Sleep | stopping, then asleep (state_saved)", "sleep"),
		row(tt, "asleep | Wake | starting, then running", "wake"),
		row(tt, "running or starting | Stop | stopping, then stopped", "stop"),
		row(tt, "stopped | Start | starting, then running", "start"),
		row(tt, "asleep | Stop | stopped; the snapshot is discarded", "asleep stop"),
		row(tt, "any | Delete | gone", "delete"),
		row("What is kept", "Disk | Across sleep: Yes; across stop: Yes", "start"),
		row("What is kept", "Running processes | Across sleep: Yes, from the snapshot; across stop: No", "wake"),
		{Seed: "001", Table: tt, Row: "running | 15 minutes without use | asleep",
			Skip: "the idle sleep is the operator's --desktop-idle; not settable through the API"},
	}
}
