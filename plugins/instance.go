package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"wb/internal/logbudget"
	"wb/session"
)

const (
	pageSize       = 65536
	maxLogLines    = 32   // per call
	maxLogBytes    = 1024 // per line
	maxCapturedOut = 2048 // of the guest's stdout and stderr, per call, for failure reasons
)

// instance is one instantiated plugin. One call at a time.
type instance struct {
	mod           api.Module
	alloc, decide api.Function
	mem           api.Memory
	limitBytes    uint64
	depth         api.MutableGlobal // the stack's count (boundStack), set to 0 before each call
	deep          api.MutableGlobal // set by a call whose count passed keptStackBytes
	stack         [2]uint64
	out           capture // the guest's stdout and stderr, since the call began
}

// newInstance starts an instance of m for the project's plugin (named in its wb.log lines).
func (h *Host) newInstance(ctx context.Context, m *module, project, plugin string) (*instance, error) {
	inst := &instance{limitBytes: uint64(m.key.pages) * pageSize}
	// No start functions: they are called below, so that the stack's count is set first and
	// read after a failure.
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithStdout(&inst.out).
		WithStderr(&inst.out)
	// The host's default ModuleConfig is already deterministic: no args, no environment, no
	// file system, fake clocks (starting 2022-01-01, +1ms a reading), a seeded random source and
	// sleeps that return at once.
	// The start is a call of its own for wb.log: its lines are capped and name the plugin. It
	// has no configuration (ABI.md).
	st := &callState{h: h, project: project, plugin: plugin}
	ictx, cancel := context.WithTimeout(context.WithValue(ctx, stateKey{}, st), h.o.InitTimeout)
	defer cancel()
	mod, err := m.rt.InstantiateModule(ictx, m.cm, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &CallError{Kind: FailStart, Cause: "failed to start: " + inst.describe(err, h.o.InitTimeout)}
	}
	inst.mod = mod
	inst.depth, _ = mod.ExportedGlobal(stackExport).(api.MutableGlobal)
	inst.deep, _ = mod.ExportedGlobal(deepExport).(api.MutableGlobal)
	if inst.depth == nil || inst.deep == nil {
		inst.close()
		return nil, &CallError{Kind: FailStart, Cause: "failed to start: the host's stack count is missing"}
	}
	// The module's start section (exported as startExport), then _initialize, as wazero
	// would call them: an exit with code 0 ends the start without failing it.
	for _, name := range []string{startExport, "_initialize"} {
		f := mod.ExportedFunction(name)
		if f == nil {
			continue
		}
		inst.depth.Set(0)
		if _, err := f.Call(ictx); err != nil {
			var ee *sys.ExitError
			if errors.As(err, &ee) && ee.ExitCode() == 0 {
				break
			}
			cause := inst.describe(err, h.o.InitTimeout)
			inst.close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &CallError{Kind: FailStart, Cause: "failed to start: " + cause}
		}
	}
	inst.alloc = mod.ExportedFunction("alloc")
	inst.decide = mod.ExportedFunction("decide")
	inst.mem = mod.ExportedMemory("memory")
	if inst.alloc == nil || inst.decide == nil || inst.mem == nil {
		inst.close()
		return nil, &CallError{Kind: FailStart, Cause: "failed to start: missing memory, alloc or decide"}
	}
	return inst, nil
}

func (inst *instance) close() {
	if inst.mod != nil {
		_ = inst.mod.Close(context.Background())
	}
}

// callState is what the wb host functions of one call see, through its context.
type callState struct {
	h       *Host
	project string
	plugin  string
	config  map[string]string
	logs    int
}

type stateKey struct{}

// result is the JSON a plugin answers.
type result struct {
	Allow    *bool          `json:"allow"`
	Reasons  []string       `json:"reasons"`
	Warnings []string       `json:"warnings"`
	Patch    map[string]any `json:"patch"`
}

// invoke runs one decision: alloc, write the input, decide, read the result. It answers a
// *CallError when the plugin failed (the instance must then be discarded) and ctx's error when
// the caller's context ended.
func (h *Host) invoke(ctx context.Context, inst *instance, st *callState, input []byte, timeout time.Duration) (session.Decision, error) {
	inst.out.reset()
	cctx, cancel := context.WithTimeout(context.WithValue(ctx, stateKey{}, st), timeout)
	defer cancel()
	fail := func(err error) (session.Decision, error) {
		if ctx.Err() != nil {
			return session.Decision{}, ctx.Err()
		}
		return session.Decision{}, &CallError{Kind: inst.kind(err), Cause: inst.describe(err, timeout)}
	}
	s := inst.stack[:]
	s[0] = uint64(len(input))
	inst.depth.Set(0)
	inst.deep.Set(0)
	if err := inst.alloc.CallWithStack(cctx, s[:1]); err != nil {
		return fail(err)
	}
	ptr := uint32(s[0])
	if ptr == 0 && len(input) > 0 || !inst.mem.Write(ptr, input) {
		return fail(&abiError{fmt.Sprintf("alloc(%d) returned %#x, outside its memory of %d bytes", len(input), ptr, inst.mem.Size())})
	}
	s[0], s[1] = uint64(ptr), uint64(len(input))
	inst.depth.Set(0)
	if err := inst.decide.CallWithStack(cctx, s); err != nil {
		return fail(err)
	}
	// wazero keeps a function's call stack, grown as deep as a call went (in the host's heap,
	// outside the memory cap), for the function's next call: after a call whose count passed
	// keptStackBytes the instance takes fresh functions, and the stack goes with the old ones
	// (doing so every call would cost 20 KiB).
	if inst.deep.Get() != 0 {
		inst.alloc, inst.decide = inst.mod.ExportedFunction("alloc"), inst.mod.ExportedFunction("decide")
	}
	outPtr, outLen := uint32(s[0]>>32), uint32(s[0])
	if int64(outLen) > int64(h.o.MaxOutputBytes) {
		return fail(&outputError{fmt.Sprintf("answered %d bytes, more than the %d allowed", outLen, h.o.MaxOutputBytes)})
	}
	out, ok := inst.mem.Read(outPtr, outLen)
	if !ok {
		return fail(&outputError{fmt.Sprintf("answered bytes %#x+%d, outside its memory of %d bytes", outPtr, outLen, inst.mem.Size())})
	}
	var r result
	if err := json.Unmarshal(out, &r); err != nil {
		return fail(&outputError{"answered invalid JSON: " + jsonProblem(err, out)})
	}
	if r.Allow == nil {
		return fail(&outputError{`answered JSON without a boolean "allow"`})
	}
	return session.Decision{Allow: *r.Allow, Reasons: r.Reasons, Warnings: r.Warnings, Patch: r.Patch}, nil
}

type abiError struct{ msg string }

func (e *abiError) Error() string { return e.msg }

type outputError struct{ msg string }

func (e *outputError) Error() string { return e.msg }

func jsonProblem(err error, out []byte) string {
	const show = 40
	prefix := out[:min(len(out), show)]
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "json: ")
	if len(out) > show {
		return fmt.Sprintf("%s (begins %q…)", msg, prefix)
	}
	return fmt.Sprintf("%s (%q)", msg, prefix)
}

// kind classifies a failed call.
func (inst *instance) kind(err error) FailureKind {
	var ee *sys.ExitError
	var oe *outputError
	switch {
	case errors.As(err, &ee) && (ee.ExitCode() == sys.ExitCodeDeadlineExceeded || ee.ExitCode() == sys.ExitCodeContextCanceled):
		return FailTimeout
	case errors.As(err, &oe):
		return FailOutput
	case inst.atLimit() || strings.Contains(inst.out.String(), "out of memory"):
		return FailMemory
	}
	return FailTrap
}

// atLimit reports whether the instance's memory has grown to its limit.
func (inst *instance) atLimit() bool {
	return inst.mem != nil && uint64(inst.mem.Size())+pageSize > inst.limitBytes
}

// describe says what went wrong in a few words, for a deny reason.
func (inst *instance) describe(err error, timeout time.Duration) string {
	var ee *sys.ExitError
	var oe *outputError
	var ae *abiError
	mem := ""
	if inst.atLimit() {
		mem = fmt.Sprintf(" at its memory limit of %s", bytesString(inst.limitBytes))
	}
	switch {
	case errors.As(err, &oe):
		return oe.msg
	case errors.As(err, &ae):
		return ae.msg
	case errors.As(err, &ee) && ee.ExitCode() == sys.ExitCodeDeadlineExceeded:
		return "timed out after " + timeout.String()
	case errors.As(err, &ee) && ee.ExitCode() == sys.ExitCodeContextCanceled:
		return "canceled"
	case inst.depth != nil && uint32(inst.depth.Get()) > MaxStackBytes:
		// boundStack's check trapped: the count is left past the bound.
		return fmt.Sprintf("exceeded its stack limit of %s: its calls nest too deep", bytesString(MaxStackBytes))
	}
	// A Go guest's runtime says what happened on stderr before it traps or exits.
	crash, first := inst.out.failureLine()
	switch {
	case strings.Contains(crash, "out of memory"):
		if mem == "" && inst.mem != nil {
			// Its runtime asked for more than was left (Go's grows its heap 4 MiB at a time).
			mem = fmt.Sprintf(" with %s of its %s memory limit in use", bytesString(uint64(inst.mem.Size())), bytesString(inst.limitBytes))
		}
		return "ran out of memory" + mem + ": " + crash
	case crash != "":
		return "crashed" + mem + ": " + crash
	case errors.As(err, &ee) && first != "":
		return fmt.Sprintf("exited with code %d%s: %s", ee.ExitCode(), mem, first)
	case errors.As(err, &ee):
		return fmt.Sprintf("exited with code %d%s", ee.ExitCode(), mem)
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	msg = startFailedRE.ReplaceAllString(msg, "")
	msg = strings.TrimSuffix(msg, " (recovered by wazero)")
	msg = strings.TrimPrefix(msg, "wasm error: ")
	return "trapped" + mem + ": " + msg
}

// startFailedRE matches wazero's prefix of a start function's error.
var startFailedRE = regexp.MustCompile(`^module\[[^\]]*\] function\[[^\]]*\] failed: `)

func bytesString(n uint64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// capture keeps the first bytes a guest writes to stdout and stderr during one call.
type capture struct{ buf []byte }

func (c *capture) Write(p []byte) (int, error) {
	if room := maxCapturedOut - len(c.buf); room > 0 {
		c.buf = append(c.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (c *capture) reset()         { c.buf = c.buf[:0] }
func (c *capture) String() string { return string(c.buf) }

// failureLine answers the line of a Go runtime failure ("panic: …", "fatal error: …"), if
// any, and the first line written.
func (c *capture) failureLine() (crash, first string) {
	for line := range bytes.Lines(c.buf) {
		l := strings.TrimSpace(string(line))
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			return truncate(l, 200), truncate(first, 200)
		}
		if first == "" {
			first = l
		}
	}
	return "", truncate(first, 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Host functions of the wb module.

// hostLog is wb.log(level, ptr, len).
func (h *Host) hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	level, ptr, n := int32(stack[0]), uint32(stack[1]), uint32(stack[2])
	st, _ := ctx.Value(stateKey{}).(*callState)
	msg, ok := mod.Memory().Read(ptr, n)
	if !ok {
		panic(&abiError{fmt.Sprintf("wb.log: message %#x+%d is outside the memory", ptr, n)})
	}
	project, plugin := "", ""
	if st != nil {
		if st.logs++; st.logs > maxLogLines {
			return
		}
		project, plugin = st.project, st.plugin
	}
	lvl := slog.LevelInfo
	switch level {
	case 0:
		lvl = slog.LevelDebug
	case 2:
		lvl = slog.LevelWarn
	case 3:
		lvl = slog.LevelError
	}
	if !h.log.Enabled(ctx, lvl) {
		return
	}
	// The calls' own cap bounds a call, not the calls a project's guests cause (every exec and
	// egress attempt, thousands a second): the project's budget bounds the operator's log.
	ok, dropped := h.logs.Take(project, time.Now())
	if dropped > 0 {
		h.log.Warn("a project's plugins log more than their budget; lines of theirs were dropped", "project", project,
			"dropped", dropped, "budget", logbudget.Limits())
	}
	if !ok {
		return
	}
	h.log.LogAttrs(ctx, lvl, truncate(string(msg[:min(len(msg), maxLogBytes+1)]), maxLogBytes), slog.String("project", project), slog.String("plugin", plugin))
}

// hostConfigGet is wb.config_get(key_ptr, key_len, out_ptr, out_cap) -> i32.
func hostConfigGet(ctx context.Context, mod api.Module, stack []uint64) {
	kp, kn, op, oc := uint32(stack[0]), uint32(stack[1]), uint32(stack[2]), uint32(stack[3])
	key, ok := mod.Memory().Read(kp, kn)
	if !ok {
		panic(&abiError{fmt.Sprintf("wb.config_get: key %#x+%d is outside the memory", kp, kn)})
	}
	st, _ := ctx.Value(stateKey{}).(*callState)
	var v string
	if st != nil {
		v, ok = st.config[string(key)]
	} else {
		ok = false
	}
	switch {
	case !ok:
		stack[0] = api.EncodeI32(-1)
	case uint64(len(v)) > uint64(oc):
		stack[0] = api.EncodeI32(int32(len(v)))
	default:
		if !mod.Memory().WriteString(op, v) {
			panic(&abiError{fmt.Sprintf("wb.config_get: buffer %#x+%d is outside the memory", op, oc)})
		}
		stack[0] = api.EncodeI32(int32(len(v)))
	}
}
