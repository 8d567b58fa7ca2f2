package cloudhv

import (
	"fmt"
	"strconv"
	"strings"

	"wb/hypervisor"
	"wb/hypervisor/cloudhv/image"
)

// Linux's limits on what the command line gives init (init/main.c): COMMAND_LINE_SIZE on
// x86 and MAX_INIT_ARGS / MAX_INIT_ENVS (CONFIG_INIT_ENV_ARG_LIMIT, 32, with the kernel's own
// HOME= and TERM= counted among the envs and argv[0] among the args).
const (
	maxCmdline  = 2048
	maxInitEnvs = 32 - 2
	maxInitArgs = 32 - 1
)

// kernelKeys are command-line parameters Linux (or its early init code) consumes itself: an
// environment variable with one of these names would never reach init.
var kernelKeys = map[string]bool{
	"console": true, "root": true, "rootfstype": true, "rootflags": true, "rootwait": true, "rootdelay": true,
	"ro": true, "rw": true, "init": true, "rdinit": true, "panic": true, "quiet": true, "debug": true,
	"loglevel": true, "earlyprintk": true, "reboot": true, "nokaslr": true, "noapic": true, "nomodules": true,
	"pci": true, "tsc": true, "mitigations": true, "mem": true, "memmap": true, "maxcpus": true, "nosmp": true,
	"initrd": true, "noinitrd": true, "resume": true, "ip": true, "nfsroot": true, "splash": true,
}

// cmdlineBase is image.Cmdline up to init=: the console and the read-only root disk.
func cmdlineBase() string {
	base, _, _ := strings.Cut(image.Cmdline, " init=")
	return base
}

// kernelCmdline is the command line that boots s: the guest's address (guestIPParam), init=
// its Args[0], its environment as KEY=VALUE words, and after " -- " init's arguments, with
// the agent's --socket turned into --vsock-port (a VM's agent is reached over vsock). Linux splits the line on spaces with
// only double quotes to protect them, gives init at most 30 variables and 31 arguments, and
// keeps words it knows (or with a dot in the key) for itself; anything the line cannot carry
// faithfully is refused, naming the word.
func kernelCmdline(s hypervisor.Spec) (string, error) {
	if len(s.Args) == 0 || !strings.HasPrefix(s.Args[0], "/") {
		return "", fmt.Errorf("cloudhv: spec args[0] must be init's absolute path, got %q", s.Args)
	}
	env := append([]string(nil), s.Env...)
	if !hasKey(env, "PATH") {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	// panic_on_oom: the guest's kernel would kill a process and tell the host nothing; a
	// panic reaches the host (pvpanic) with the reason on the console (see Events).
	words := []string{cmdlineBase(), "sysctl.vm.panic_on_oom=1", guestIPParam(), "init=" + s.Args[0]}
	if err := plainWord(s.Args[0]); err != nil {
		return "", fmt.Errorf("cloudhv: init %q: %w", s.Args[0], err)
	}
	if len(env) > maxInitEnvs {
		return "", fmt.Errorf("cloudhv: spec env has %d variables; Linux passes init at most %d from the kernel command line", len(env), maxInitEnvs)
	}
	for _, kv := range env {
		key, val, ok := strings.Cut(kv, "=")
		switch {
		case !ok || !validEnvKey(key):
			return "", fmt.Errorf("cloudhv: env %q: want KEY=VALUE with KEY of [A-Za-z_][A-Za-z0-9_]* (a dot would make it a module parameter)", kv)
		case kernelKeys[key]:
			return "", fmt.Errorf("cloudhv: env %q: Linux takes %s= for itself; it would not reach init", kv, key)
		}
		if err := plainWord(val); err != nil && val != "" {
			return "", fmt.Errorf("cloudhv: env %s: %w", key, err)
		}
		words = append(words, kv)
	}
	args := agentArgs(s.Args)
	if len(args) > maxInitArgs {
		return "", fmt.Errorf("cloudhv: spec has %d init arguments; Linux passes init at most %d", len(args), maxInitArgs)
	}
	if len(args) > 0 {
		words = append(words, "--")
	}
	for _, a := range args {
		if err := plainWord(a); err != nil {
			return "", fmt.Errorf("cloudhv: init argument %q: %w", a, err)
		}
		words = append(words, a)
	}
	line := strings.Join(words, " ")
	if len(line) >= maxCmdline {
		return "", fmt.Errorf("cloudhv: the kernel command line would be %d bytes; Linux keeps %d: shorten the spec's env or args", len(line), maxCmdline-1)
	}
	return line, nil
}

// agentArgs is init's argv[1:]. For `wb agent`, --socket PATH becomes --vsock-port
// image.AgentVsockPort, and the egress relay's flags are dropped: the egress socket is a
// host Unix socket in the agent dir, which a VM cannot reach; the driver relays from the
// guest's tap instead (see doc.go).
func agentArgs(args []string) []string {
	rest := args[1:]
	if args[0] != hypervisor.GuestAgentBin || len(rest) == 0 || rest[0] != "agent" {
		return append([]string(nil), rest...)
	}
	out := []string{"agent"}
	vsock := false
	for i := 1; i < len(rest); i++ {
		name, _, hasVal := strings.Cut(rest[i], "=")
		switch name {
		case "--socket", "-socket":
			if !hasVal {
				i++ // the value is the next word
			}
			if !vsock {
				out = append(out, "--vsock-port", strconv.Itoa(image.AgentVsockPort))
				vsock = true
			}
		case "--egress-listen", "-egress-listen", "--egress-socket", "-egress-socket":
			if !hasVal {
				i++
			}
		case "--vsock-port", "-vsock-port":
			vsock = true
			out = append(out, rest[i])
		default:
			out = append(out, rest[i])
		}
	}
	if !vsock {
		out = append(out, "--vsock-port", strconv.Itoa(image.AgentVsockPort))
	}
	return out
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}

func validEnvKey(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range []byte(k) {
		letter := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// plainWord refuses what Linux's command-line parser would change: spaces split words,
// double quotes are eaten, control bytes and non-ASCII are not safe to pass, and a lone "--"
// would end the kernel's part.
func plainWord(w string) error {
	if w == "" {
		return fmt.Errorf("an empty word cannot be passed on the kernel command line")
	}
	if w == "--" {
		return fmt.Errorf(`"--" cannot be passed: it separates the kernel's words from init's`)
	}
	for _, c := range []byte(w) {
		if c <= ' ' || c == '"' || c >= 0x7f {
			return fmt.Errorf("byte %q cannot be passed on the kernel command line (no spaces, quotes, control or non-ASCII bytes)", c)
		}
	}
	return nil
}
