package node

import (
	"slices"
	"strings"

	"wb/agent"
	"wb/hypervisor/templates"
)

// A warm tier-1 guest of a runner pool (Pool.Runner) has its runtime's interpreter started
// already, waiting in the guest's agent for one run's code (agent.RunnerRequest): a run then
// pays neither the guest's start nor the interpreter's. Runtimes without a loader here run
// as a plain exec, in a warm guest all the same.

// runnerSpec is how one runtime's interpreter is started ahead of its code.
type runnerSpec struct {
	// loader is the program given to the runtime's argv in place of the code.
	loader string
	// coldEnv are the environment names (or name prefixes, ending in "*") that the
	// interpreter reads as it starts: a run that sets one runs as a plain exec, so that it
	// takes effect as it would.
	coldEnv []string
}

// pythonLoader runs one exec's code as `python3 -c CODE` would: in a fresh __main__ (the
// globals -c starts with), with sys.argv ['-c'], the exec's environment and working
// directory, the code compiled as "<string>", an uncaught exception's traceback printed
// without the loader's frame and exit code 1, SystemExit as the interpreter handles it. It
// imports nothing os and sys did not (both are loaded at every start). It says it is ready
// on fd 4 and reads the frame (agent.runnerFrame) from fd 3.
const pythonLoader = `_wb_g = dict(globals())
def _wb_run(g):
    import os, sys
    os.write(4, b"r")
    os.close(4)
    chunks = []
    while True:
        c = os.read(3, 65536)
        if not c:
            break
        chunks.append(c)
    os.close(3)
    head, _, code = b"".join(chunks).partition(b"\0\0")
    parts = head.split(b"\0")
    os.environb.clear()
    os.environb.update(kv.split(b"=", 1) for kv in parts[1:])
    os.chdir(parts[0])
    src = code.decode("utf-8", "surrogateescape")
    m = sys.modules["__main__"].__dict__
    m.clear()
    m.update(g)
    del g, head, parts, chunks, c, code
    try:
        exec(compile(src, "<string>", "exec"), m)
    except SystemExit:
        raise
` + loaderUncaught + `_wb_run(_wb_g)
`

// directLoader is pythonLoader as a direct guest's init (agent.DirectGuest): it reads its
// frame from stdin, a socket, after saying it is ready there, and writes the exit status there
// as it ends (last, once stdout and stderr are flushed: atexit runs the first handler
// registered last); os._exit says it too, in the loader's process, and so does a signal that
// would end python3 -c (SIGTERM, SIGHUP, SIGALRM, SIGUSR1, SIGUSR2, SIGQUIT: init ignores
// them by default). Unlike python3 -c's, the code's process is the guest's init: a signal it
// cannot catch (SIGKILL, SIGSEGV) or an os.exec* that replaces it leaves no status, and the
// run answers 137 (agent.DirectNoStatus). It is started with two
// arguments, taken from sys.argv (which the code then sees as python3 -c gives it, ['-c']):
// the guest loopback address of its egress relay, and the host Unix socket it relays to, or
// two empty ones for none. The relay stands in for the agent's (agent.forwarder): a
// thread accepts on the proxy address the guest's processes are given, and relays each
// connection byte for byte to the node's egress proxy, which asks the runtime policy. Mode
// 'x' starts the frame's argv in a child instead (the environment sets what the interpreter
// reads as it starts), and says the child's status.
const directLoader = `_wb_g = dict(globals())
def _wb_direct(g):
    import os, sys, atexit
    relay, upstream = sys.argv[1], sys.argv[2]
    del sys.argv[1:]
    # The status goes back on a private copy of stdin (os.dup's is not inherited): the code
    # may close its stdin (open(0).read() does), and the status must still go out.
    me, st, real_exit, sfd = os.getpid(), [1], os._exit, os.dup(0)
    def say(code):
        try:
            os.write(sfd, b"x%d\n" % code)
        except OSError:
            pass
    def fin():
        if os.getpid() != me:
            return
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        say(st[0])
    def _exit(n):
        if os.getpid() == me:
            say(n & 255)
        real_exit(n)
    atexit.register(fin)
    if relay:
        import _socket, _thread
        host, _, port = relay.rpartition(":")
        ls = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        ls.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        ls.bind((host, int(port)))
        ls.listen(128)
        def pair(c):
            try:
                u = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                u.connect(upstream)
            except OSError:
                c.close()
                return
            left, lk = [2], _thread.allocate_lock()
            def pump(a, b):
                try:
                    while True:
                        d = a.recv(65536)
                        if not d:
                            break
                        b.sendall(d)
                except OSError:
                    pass
                try:
                    b.shutdown(_socket.SHUT_WR)
                except OSError:
                    pass
                with lk:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    c.close()
                    u.close()
            _thread.start_new_thread(pump, (u, c))
            pump(c, u)
        def serve():
            import time
            while True:
                try:
                    fd, _ = ls._accept()
                except OSError:
                    time.sleep(0.1)  # out of descriptors, say: not a spin
                    continue
                c = _socket.socket(fileno=fd)
                try:
                    _thread.start_new_thread(pair, (c,))
                except RuntimeError:  # no thread to be had: this connection is refused
                    c.close()
        _thread.start_new_thread(serve, ())
    os.write(sfd, b"r")
    def take(k):
        b = b""
        while len(b) < k:
            c = os.read(sfd, k - len(b))
            if not c:
                real_exit(0)
            b += c
        return b
    frame = take(int.from_bytes(take(8), "big"))
    head, _, payload = frame.partition(b"\0\0")
    parts = head.split(b"\0")
    mode, wd, env = parts[0], parts[1], [kv.split(b"=", 1) for kv in parts[2:]]
    del frame, head, parts
    if mode == b"x":
        argv = payload.split(b"\0")
        pid = os.fork()
        if pid == 0:
            try:
                import _signal  # as a shell starts a command: Python ignores these two
                _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
                _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
                os.chdir(wd)
                os.execvpe(argv[0], argv, dict(env))
            except OSError as e:
                os.write(2, b"wb: cannot run %s: %s\n" % (argv[0], str(e).encode()))
                real_exit(127 if isinstance(e, FileNotFoundError) else 126)
        c = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        st[0] = 128 - c if c < 0 else c
        fin()
        real_exit(st[0])
    os.environb.clear()
    os.environb.update(env)
    os.chdir(wd)
    src = payload.decode("utf-8", "surrogateescape")
    m = sys.modules["__main__"].__dict__
    m.clear()
    m.update(g)
    del g, payload, env
    os._exit = _exit
    # As the guest's init, the loader would ignore a signal whose action is the default (the
    # kernel's rule for init): these end it as they would end python3 -c, 128+N. A forked
    # child, no init, takes the signal itself.
    import _signal
    def died(n, _):
        if os.getpid() != me:
            _signal.signal(n, _signal.SIG_DFL)
            os.kill(os.getpid(), n)
            return
        say(128 + n)
        real_exit(128 + n)
    for n in (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGALRM, _signal.SIGUSR1, _signal.SIGUSR2, _signal.SIGQUIT):
        _signal.signal(n, died)
    try:
        exec(compile(src, "<string>", "exec"), m)
        st[0] = 0
    except SystemExit as e:
        c = e.code
        st[0] = 0 if c is None else c & 255 if isinstance(c, int) else 1
        raise
` + loaderUncaught + `_wb_direct(_wb_g)
`

// loaderUncaught ends both loaders' try of the code: an uncaught exception's traceback,
// without the loader's frame, and exit code 1, as python3 -c prints and ends.
const loaderUncaught = `    except BaseException as e:
        if e.__traceback__ is not None:
            e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        del e
        sys.exit(1)
`

// runnerFor answers the runner of runtime name, if it has one.
func runnerFor(name string) (runnerSpec, bool) {
	switch name {
	case "python3":
		return runnerSpec{loader: pythonLoader, coldEnv: []string{"PYTHON*", "LANG", "LC_*"}}, true
	}
	return runnerSpec{}, false
}

// coldEnvSet reports whether env sets a name the interpreter reads as it starts.
func (r runnerSpec) coldEnvSet(env map[string]string) bool {
	for k := range env {
		for _, c := range r.coldEnv {
			if k == c || strings.HasSuffix(c, "*") && strings.HasPrefix(k, strings.TrimSuffix(c, "*")) {
				return true
			}
		}
	}
	return false
}

// runnerRequest answers the agent request that starts runtime rtName's runner in a guest of
// tpl; false when tpl has no such runtime or the runtime has no runner.
func runnerRequest(tpl templates.Template, rtName string) (agent.RunnerRequest, bool) {
	spec, ok := runnerFor(rtName)
	if !ok {
		return agent.RunnerRequest{}, false
	}
	i := slices.IndexFunc(tpl.Runtimes, func(r templates.Runtime) bool { return r.Name == rtName })
	if i < 0 || len(tpl.Runtimes[i].Argv) == 0 {
		return agent.RunnerRequest{}, false
	}
	return agent.RunnerRequest{Name: rtName, Argv: tpl.Runtimes[i].Argv, Loader: spec.loader}, true
}

// runnerOf answers the runner an exec of argv with env may use in a guest of tpl: the runtime
// whose argv plus one argument (the code) argv is, when that runtime has a runner and env sets
// nothing its interpreter reads at start; "" otherwise (the agent runs it as usual, as it does
// when no runner waits).
func runnerOf(tpl templates.Template, argv []string, env map[string]string) string {
	for _, r := range tpl.Runtimes {
		if len(argv) != len(r.Argv)+1 || !slices.Equal(argv[:len(r.Argv)], r.Argv) {
			continue
		}
		if spec, ok := runnerFor(r.Name); ok && !spec.coldEnvSet(env) {
			return r.Name
		}
	}
	return ""
}

// runnerFor is runnerOf for a guest of the template tplRef names ("" when it is unknown).
func (n *Node) runnerFor(tplRef string, argv []string, env map[string]string) string {
	tpl, err := n.template(tplRef)
	if err != nil {
		return ""
	}
	return runnerOf(tpl, argv, env)
}

// RunnerPools answers a runner pool (size class s, tier 1's default) for each runtime of the
// catalog that has a runner here, on the template a run of that runtime uses (the first that
// offers it, as session.Catalog.Runtime picks): at least size guests, growing with the runs'
// rate up to most. size 0 is none: no pool, not one that grows from nothing.
func RunnerPools(c templates.Catalog, size, most int) []Pool {
	if size <= 0 {
		return nil
	}
	var out []Pool
	seen := map[string]bool{}
	for _, t := range CatalogOf(c) {
		for _, r := range t.Runtimes {
			if seen[r.Name] {
				continue
			}
			seen[r.Name] = true
			if _, ok := runnerFor(r.Name); ok {
				out = append(out, Pool{Template: t.Name, SizeClass: "s", Size: max(size, 0), Max: most, Runner: r.Name})
			}
		}
	}
	return out
}
