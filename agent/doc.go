// Package agent is `wb agent`, the process inside every guest (a runsc or runc container), run
// as its init (PID 1). It serves HTTP/1.1 on a Unix socket in a bind-mounted host directory,
// which the node reaches with Client. It imports nothing of wb's but wb/session and builds
// with CGO_ENABLED=0.
//
// Routes (errors are JSON {"error":{"code","message","param"}}):
//
//   - GET /v1/health → {"ok":true,"pid":N}.
//   - POST /v1/exec, body ExecRequest → 200 application/x-ndjson, streamed (the status goes
//     out with the first output, or with the result of a command that wrote none): output lines
//     {"stream":"stdout"|"stderr","data":"..."} of at most 32 KiB each, flushed as they come
//     (data is the bytes as a JSON string when they are valid UTF-8, which a chunk boundary never
//     breaks; otherwise base64 with "encoding":"base64"), then {"exit_code":N,"duration_ms":N,
//     "timed_out":bool} (duration_ms to the nearest millisecond). The command runs directly
//     (argv[0] looked up in its PATH), in its own process group, in Cwd (default Root), with
//     the agent's environment, PATH/HOME/LANG defaulted, plus Env. Exit codes: the status, 128+N for signal N, 124 on timeout (the group
//     gets SIGKILL), 127 when the command or cwd is not found and 126 when it cannot start (with
//     the reason on stderr). A client that goes away gets its process group killed. Background
//     processes that outlive the command survive it; their hold on stdout/stderr is cut after
//     250 ms of silence (5 s at most) once the command exited. Invalid bodies are 400s.
//     With "runner" naming a runner that waits and fits argv, the code goes to it instead.
//     A proxy in front of the agent (the node's) may end an answer that broke off (the guest
//     died under it) with {"error":{"status":N,"code","message"}}, the reason it knows;
//     Client.Exec answers it as an *Error. Such a line is the proxy's alone: the proxy ends
//     an answer with its own 502 guest_error at one from the agent (ProxyLine), and a client
//     of the agent itself (NewClient, NewDialClient) refuses one as a plain error.
//   - POST /v1/runners, body RunnerRequest → 201 {"name","pid"} once the loader (argv plus the
//     loader) said it is ready on fd 4; 502 runner_failed, with its stderr, when it exited or
//     stayed silent first. It then waits for one exec's frame on fd 3 (see ExecRequest.Runner).
//   - GET /v1/pty?cols=&rows=&command=&cwd= → WebSocket to a PTY running /bin/sh (or
//     /bin/sh -c command) with TERM=xterm; binary frames carry terminal bytes both ways; the text
//     frame {"type":"resize","cols":N,"rows":N} resizes. At exit the agent sends
//     {"type":"exit","exit_code":N} and closes with 1000; a client that goes away gets every
//     process of the terminal's session SIGHUP, then SIGKILL if the shell still runs 2 s later.
//     cols/rows must be 1–1000 (400 naming the parameter).
//   - GET /v1/files?path=P reads raw bytes (404 missing, 400 directory); GET ...&list=1 lists a
//     directory as [FileInfo], by name (413 past 100,000 entries); PUT /v1/files?path=P[&mode=0755] writes the body atomically (temp
//     file, fsync, rename; parents created; 413 over 100 MiB); DELETE removes a file or an empty
//     directory (204; 404 missing, 409 not empty). Relative paths resolve against Root; absolute
//     ones are allowed (the guest is the boundary, not Root).
//   - POST /v1/quiesce {"for_ms":N} (1–60000): closes the listener (removing the socket file),
//     every connection and every PTY (killing what runs on them) and the egress relay's
//     listener and connections, answers 200 once all are gone on its own connection with a
//     body that ends when the agent closes that connection, waits N ms and listens again on the
//     same path. So when Client.Quiesce returns, the guest holds no host socket and no TCP
//     endpoint and can be checkpointed (runsc refuses either); a restored guest's timer
//     simply goes on and it listens again, as does the original.
//   - POST /v1/procs/end ends every process of the guest but the agent, as the fork-bomb
//     guard does, → 200 {"ended":N}; 501 unsupported where the agent keeps no pids cgroup (see
//     below) and is not the guest's init either (as init, a runc guest's, it ends them by
//     kill(-1)). The node asks when the guest's sandbox nears its host process limit, and when
//     the host's guests near their process total and this guest holds the most (an agent
//     from before it answers 404: Client.EndProcs, EndUnsupported).
//
// Exhaustion stays in the guest: with Config.PidsMax (runsc guests) every exec and PTY process
// starts in a pids cgroup of gVisor's, below the sandbox's host limit (forked by one thread of
// the agent's that lives there; the hierarchy is unmounted once set up and no file of it that a
// write could use stays open, so guest root can neither raise the limit nor leave it), and the
// agent ends them all when they stay at that limit (a fork bomb; bombGuard samples the count
// while a guest process could fork, seldom while it stays low, and every 10 s otherwise, for a
// runner a guest process started may fork: each sample costs the host about 3 ms of CPU under
// gVisor's ptrace platform); as the guest's init it drops
// CAP_SYS_ADMIN once that cgroup is set up, and keeps spare OS threads where there is none (a
// runc guest's limit counts the agent's threads too); a command refused for the process limit
// gets exit 126 and says so.
//
// In a VM (Cloud Hypervisor) the agent listens on a vsock port (Config.VsockPort, `wb agent
// --vsock-port N`) instead of a Unix socket; with $WB_VSOCK_UNIX_DIR set (the test VMM, which
// has no vsock device) on the Unix socket $WB_VSOCK_UNIX_DIR/N.sock. An agent that listens on
// vsock and is PID 1 is a VM's init, and first does what a container runtime would (setupVM,
// each step only where it is missing and where it can): /proc, /sys, /dev, /dev/pts, /dev/shm,
// /sys/fs/cgroup, the writable disk /dev/vdb at /run/wb-writable with its workspace/, tmp/ and
// root/ bound at /workspace, /tmp and /root, the hostname, lo. Its environment is the kernel
// command line's KEY=VALUE words, which Linux gives init.
//
// As PID 1 (Config.Reap) the agent reaps orphans without ever collecting its own children's
// statuses: see procTable.
//
// DirectGuest is the host's side of a guest with no agent (a tier-1 run's, under gVisor): its
// init is a runtime's loader, whose standard streams the host holds, and which takes one
// exec, answered as the agent answers it (Exec, ServeExec), from the same code (streamOutput,
// the frame of a runner).
package agent
